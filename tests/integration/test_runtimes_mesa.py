"""Mesa's shader cache, run for real in a mount whose limit forces eviction: Debian's Mesa (llvmpipe, through
EGL surfaceless) compiling and drawing with distinct GLES2 programs (tests/helpers/mesa-shaders.c), its
multi-file cache under MESA_SHADER_CACHE_DIR as kcache env sets it. Every program must paint what it
should, Mesa must say nothing, its index (mapped by every GL process) must stay, entries evicted must be
stored again and then served, a warm run must be faster than a cold one, and the limit must hold while
the index equals the tree."""
import os
import subprocess

import pytest

from conftest import ROOT
from test_runtimes_conformance import evicted, index_matches_tree

BUILD = os.environ.get("KCACHE_BUILD") or os.path.join(ROOT, "build")
# The plain build's helper where there is one: Mesa's own allocations are not ours to leak-check.
HELPER = next((p for p in (os.path.join(ROOT, "build", "tests", "mesa-shaders"),
                           os.path.join(BUILD, "tests", "mesa-shaders")) if os.path.exists(p)), None)

pytestmark = pytest.mark.skipif(HELPER is None, reason="needs Mesa's EGL and GLES2 (libegl-dev, libgles-dev)")


def shaders(first, count, cache=None):
    """Runs the helper: {programs, seconds, wrong, failed}. cache None: Mesa's cache off."""
    env = dict(os.environ, EGL_PLATFORM="surfaceless", LIBGL_ALWAYS_SOFTWARE="1", GALLIUM_DRIVER="llvmpipe",
               ASAN_OPTIONS="detect_leaks=0")
    if cache:
        env.update(MESA_SHADER_CACHE_DIR=cache, MESA_SHADER_CACHE_MAX_SIZE="64G")  # as kcache env sets it
    else:
        env["MESA_SHADER_CACHE_DISABLE"] = "true"
    p = subprocess.run([HELPER, str(first), str(count)], env=env, capture_output=True, text=True, timeout=600)
    if p.returncode == 77:
        pytest.skip(p.stderr.strip())
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stderr == "", p.stderr  # Mesa said nothing: no cache error, no warning
    out = dict(kv.split("=") for kv in p.stdout.split())
    assert out["wrong"] == "0" and out["failed"] == "0", out
    return float(out["seconds"])


def entries(cache):
    root = os.path.join(cache, "mesa_shader_cache")
    return {os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs if f != "index"}


def test_mesa_shader_cache_through_an_evicting_cache(kfs):
    # 300 programs store about 3 MB (600 entries of 4 KiB, and an index of up to 1.3 MB that grows
    # as keys fill it): twice the limit and more.
    limit = 1536 << 10
    m = kfs({"max_size": str(limit), "grace_ms": "200"})
    cache = m.path("mesa")
    os.makedirs(cache)
    index = os.path.join(cache, "mesa_shader_cache", "index")

    shaders(0, 300, cache)
    assert evicted(m) > 0, "the limit never forced an eviction"
    assert os.path.exists(index), "Mesa's index was evicted"
    index_size = os.path.getsize(index)
    m.assert_within(limit)

    # The most recently stored programs are served from the cache: a warm run of them against the same
    # programs with Mesa's cache off.
    cold = shaders(270, 30)
    before = entries(cache)
    warm = shaders(270, 30, cache)
    assert warm < cold / 2, (warm, cold)
    assert entries(cache) == before, "a warm run stored again what it should have found"

    # Caching resumes for programs whose entries were evicted (the first ones went first): they are
    # compiled and stored again, then served.
    first = shaders(0, 20, cache)
    again = shaders(0, 20, cache)
    assert again < first / 2, (again, first)
    assert os.path.exists(index)
    assert os.path.getsize(index) == index_size  # the one Mesa made, which it maps whole
    m.assert_within(limit)
    index_matches_tree(m)
