"""ccache from Debian, run for real with CCACHE_DIR in a mount whose limit forces eviction, compiling a
real C project (this one's own sources) again and again: every object equals the compiler's own, ccache
reports no error, its settings (ccache.conf) survive, what was evicted is stored and hit again, and a
warm compile is faster than a cold one, while the limit holds and the index equals the tree."""
import glob
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import ROOT
from test_runtimes_conformance import evicted, index_matches_tree

KCACHE = os.environ.get("KCACHE_BIN") or os.path.join(os.environ.get("KCACHE_BUILD") or os.path.join(ROOT, "build"),
                                                      "kcache")

pytestmark = pytest.mark.skipif(not shutil.which("ccache"), reason="needs Debian's ccache")


def sources():
    """The project's C files that build with the distribution's headers alone."""
    files = sorted(glob.glob(os.path.join(ROOT, "fs", "*.c")) + glob.glob(os.path.join(ROOT, "fs", "evict", "*.c")) +
                   glob.glob(os.path.join(ROOT, "index", "*.c")) +
                   glob.glob(os.path.join(ROOT, "common", "*.c")))
    return [f for f in files if not f.endswith("fuzz.c")]


CFLAGS = subprocess.run(["pkg-config", "--cflags", "fuse3", "sqlite3"], capture_output=True,
                        text=True).stdout.split() + ["-D_GNU_SOURCE", "-std=gnu11", "-O1", "-g0"]


def compile_all(cache, files, out_dir, env_extra=None):
    """Compiles files through ccache; returns (seconds, {file: object bytes})."""
    env = dict(os.environ, CCACHE_DIR=cache, CCACHE_NOHASHDIR="1", CCACHE_BASEDIR=ROOT, **(env_extra or {}))
    os.makedirs(out_dir, exist_ok=True)
    objs = {}
    t0 = time.monotonic()
    for f in files:
        o = os.path.join(out_dir, os.path.basename(f)[:-2] + ".o")
        p = subprocess.run(["ccache", "gcc"] + CFLAGS + ["-c", f, "-o", o], env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "ccache" not in p.stderr, p.stderr[-3000:]  # ccache said nothing
        with open(o, "rb") as fo:
            objs[f] = fo.read()
    return time.monotonic() - t0, objs


def stats(cache):
    p = subprocess.run(["ccache", "--print-stats"], env=dict(os.environ, CCACHE_DIR=cache), capture_output=True,
                       text=True, check=True)
    return {k: int(v) for k, v in (l.split("\t") for l in p.stdout.splitlines() if "\t" in l)}


def test_ccache_builds_a_real_project_through_an_evicting_cache(kfs, tmp_path):
    limit = 400 << 10  # the project's objects take about 680 KiB of blocks in ccache's cache
    m = kfs({"max_size": str(limit), "grace_ms": "200"})
    cache = m.path("ccache")
    os.makedirs(cache)
    env = dict(os.environ, CCACHE_DIR=cache)
    subprocess.run(["ccache", "--max-size", "0"], env=env, check=True, capture_output=True)  # kcachefs limits
    files = sources()
    _, reference = compile_all(cache, files, str(tmp_path / "ref"), {"CCACHE_DISABLE": "1"})

    cold_t, cold = compile_all(cache, files, str(tmp_path / "a"))
    assert cold == reference
    again_t, again = compile_all(cache, files, str(tmp_path / "b"))
    assert again == reference, "an object from the cache differs from the compiler's"
    assert evicted(m) > 0, "the limit never forced an eviction"
    m.assert_within(limit)

    # What was evicted first (the first files, LRU) is compiled and stored again, then hit.
    few = files[:4]
    compile_all(cache, few, str(tmp_path / "c"))
    # (Not ccache --zero-stats: it rewrites its 272 stats files, 1 MiB of blocks, which evicts the rest.)
    before = stats(cache)
    warm_t, warm = compile_all(cache, few, str(tmp_path / "d"))
    after = stats(cache)
    hits = lambda s: s.get("direct_cache_hit", 0) + s.get("preprocessed_cache_hit", 0)
    assert warm == {f: reference[f] for f in few}
    assert hits(after) - hits(before) == len(few), (before, after)
    cold_few = sum(1 for _ in few) * cold_t / len(files)
    assert warm_t < cold_few, (warm_t, cold_few)

    # ccache's settings were never evicted, and its own view of the cache is sane.
    with open(os.path.join(cache, "ccache.conf")) as f:
        assert "max_size = 0" in f.read()
    p = subprocess.run(["ccache", "--show-stats"], env=env, capture_output=True, text=True)
    assert p.returncode == 0 and not p.stderr, p.stderr
    m.assert_within(limit)
    index_matches_tree(m)


def test_the_sizing_advice_followed_with_ccache(kfs, tmp_path):
    """The issue's case: 30 files compiled with ccache into a mount too small for them, twice (each run
    evicts what the next needs: refetches); then the mount remounted at the limit kcache stats suggests
    (evict/misses.c), and from the first run there that fills it, every compile hits: 30 of 30. ccache's
    own counters (its stats files, kept like NEO's config.file) count every compile through the evicting
    runs, so ccache -s is true; kcache stats shows them among the bytes never evicted, and kcache ls --lru
    does not list them. The mount keeps the default low watermark (90%), which the advice must allow for:
    an advice of max_size plus the distances (0 hits of 30 in the issue) is below it."""
    files = sources()[:30]
    assert len(files) == 30
    m = kfs({"max_size": "64M"})
    cache = m.path("ccache")
    os.makedirs(cache)
    env = dict(os.environ, CCACHE_DIR=cache)
    subprocess.run(["ccache", "--max-size", "0"], env=env, check=True, capture_output=True)  # kcachefs limits
    counted = lambda s: s.get("direct_cache_hit", 0) + s.get("direct_cache_miss", 0)  # each call is one
    hits = lambda s: s.get("direct_cache_hit", 0) + s.get("preprocessed_cache_hit", 0)
    # Its preprocessed sources (hundreds of KiB in flight) where a build server puts them, off the cache.
    tmp = {"CCACHE_TEMPDIR": str(tmp_path / "cctmp")}
    compile_all(cache, files, str(tmp_path / "all"), tmp)
    whole = int(os.getxattr(m.mnt, "user.kcachefs.used_bytes"))  # the working set and ccache's own files
    # A limit a little below it, as an operator would guess: close enough that a suggestion that
    # forgets the low watermark lands below the working set (the issue's 9.0 against 9.9 MiB).
    small = whole * 85 // 100 // 4096 * 4096
    m.stop()
    m.opts["max_size"] = str(small)
    m.start()
    for run in range(2):
        compile_all(cache, files, str(tmp_path / f"small{run}"), tmp)
    assert evicted(m) > 0, "the limit never forced an eviction"
    # Every compile counted by ccache, though eviction ran all along: its counters were never evicted.
    assert counted(stats(cache)) == 3 * len(files), stats(cache)
    assert stats(cache).get("preprocessor_error", 0) == 0, stats(cache)

    plain = subprocess.run([KCACHE, "stats", m.mnt], capture_output=True, text=True, check=True).stdout
    kept = re.search(r"^kept +(\d+) files \(([^)]*)\) never evicted", plain, re.M)
    assert kept and int(kept.group(1)) >= 2, plain  # ccache.conf and stats files
    assert "would have kept 9 in 10" in plain, plain
    lru = subprocess.run([KCACHE, "ls", "--lru", m.mnt], capture_output=True, text=True, check=True).stdout
    listed = [l.split()[-1] for l in lru.splitlines()[1:]]
    assert listed and not [p for p in listed if p.endswith("/stats") or p.endswith("ccache.conf")], lru
    mru = subprocess.run([KCACHE, "ls", "--mru", m.mnt], capture_output=True, text=True, check=True).stdout
    assert "ccache/ccache.conf" in mru

    suggested = int(os.getxattr(m.mnt, "user.kcachefs.suggested_max_bytes"))
    assert suggested > small
    m.stop()
    m.opts["max_size"] = str(suggested)
    m.start()
    compile_all(cache, files, str(tmp_path / "fill"), tmp)  # what the small limit had evicted is stored again
    before = stats(cache)
    compile_all(cache, files, str(tmp_path / "warm"), tmp)
    after = stats(cache)
    assert hits(after) - hits(before) == len(files), (suggested, before, after)
    assert counted(after) == 5 * len(files), after
