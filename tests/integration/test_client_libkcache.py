"""libkcache with real PoCL, the real Level Zero loader (and a fake driver the tests build), on a
kcachefs mount and on plain directories: cold and warm runs, single flight across threads and
processes, entries the driver rejects, corrupted and planted entries, the trace, pkg-config."""
import glob
import json
import os
import re
import subprocess
import time

import pytest

from conftest import ROOT, ensure_user

BUILD = os.environ.get("KCACHE_BUILD") or os.path.join(ROOT, "build")  # run-tests: build-asan in its ASan pass
CL_DEMO = os.path.join(BUILD, "tests", "kc-cl-demo")
ZE_DEMO = os.path.join(BUILD, "tests", "kc-ze-demo")
ZE_FAKE = os.path.join(BUILD, "tests", "libze_fake.so")
KC_ENTRY = os.path.join(BUILD, "tests", "kc-entry")
BLOB_TEST = os.path.join(BUILD, "tests", "test-client-blob")


def run_json(cmd, env=None, user=None, check=True):
    """Runs a demo; returns (its JSON line as a dict, wall seconds, stderr)."""
    e = dict(os.environ)
    e.pop("KCACHE_TRACE", None)
    e.update(env or {})
    if user:
        cmd = ["runuser", "-u", user, "--", "env"] + [f"{k}={v}" for k, v in (env or {}).items()] + cmd
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t0
    if check and p.returncode not in (0, 1):
        raise AssertionError(f"{cmd} exited {p.returncode}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1]), wall, p.stderr


def pocl_env(tmp, tag):
    """A fresh, empty PoCL kernel cache per run, so that only libkcache can make a run warm."""
    d = os.path.join(tmp, f"pocl-{tag}")
    os.makedirs(d, exist_ok=True)
    os.chmod(d, 0o777)
    return {"POCL_CACHE_DIR": d}


def entries(d, api="opencl"):
    return sorted(glob.glob(os.path.join(d, api, "*", "*.kce")))


def test_blob_api_on_a_kcachefs_mount(kfs):
    m = kfs({"max_size": "64M"})
    p = subprocess.run([BLOB_TEST, m.path("cache")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    files = glob.glob(m.path("cache", "blob", "*.kce"))
    assert len(files) > 400
    assert not glob.glob(m.path("cache", "blob", ".*.temp"))
    # The daemon's accounting saw every entry.
    assert m.used() >= sum(os.path.getsize(f) for f in files)


def test_opencl_cold_then_warm_on_a_mount(kfs, tmp):
    m = kfs({"max_size": "256M"})
    d = m.path("kcache")
    cold, cold_wall, _ = run_json([CL_DEMO, "--dir", d], pocl_env(tmp, "cold"))
    assert cold["err"] == 0 and cold["kernels"] == 14
    assert (cold["compiles"], cold["misses"], cold["hits"]) == (1, 1, 0)
    [entry] = entries(d)
    # The layout a person reads: opencl/<device slug>-<8 hex>/<32 hex>.kce
    dev_dir = os.path.basename(os.path.dirname(entry))
    assert dev_dir.startswith("pthread-") and len(dev_dir.rsplit("-", 1)[1]) == 8
    assert len(os.path.basename(entry)) == 32 + 4
    warm, warm_wall, _ = run_json([CL_DEMO, "--dir", d], pocl_env(tmp, "warm"))
    assert warm["checksum"] == cold["checksum"]
    assert (warm["compiles"], warm["hits"]) == (0, 1)
    # The binary refreshed after the cold run's kernels ran spares the warm run PoCL's launch-time
    # compilation: its first result comes at least 10x sooner, end to end, than the cold one's.
    assert warm["first_result_ms"] * 10 <= cold["first_result_ms"], (cold, warm)
    assert warm_wall * 10 <= cold_wall, (cold_wall, warm_wall)
    # Uncached, with PoCL's own kernel cache warm: libkcache's warm run is not slower.
    env = pocl_env(tmp, "own")
    run_json([CL_DEMO, "--no-cache"], env)
    own, own_wall, _ = run_json([CL_DEMO, "--no-cache"], env)
    assert own["checksum"] == cold["checksum"]
    print(f"\ncold {cold_wall:.3f}s first {cold['first_result_ms']:.0f}ms; warm {warm_wall:.3f}s "
          f"first {warm['first_result_ms']:.0f}ms; PoCL's own cache {own_wall:.3f}s first {own['first_result_ms']:.0f}ms")


def test_opencl_binary_the_driver_rejects_is_replaced(tmp):
    d = os.path.join(tmp, "c")
    cold, _, _ = run_json([CL_DEMO, "--dir", d], pocl_env(tmp, "a"))
    [entry] = entries(d)
    payload = os.path.join(tmp, "payload")
    subprocess.run([KC_ENTRY, "payload", entry, payload], check=True)
    with open(payload, "r+b") as f:  # a PoCL binary for another device: its device hash differs
        f.seek(8)
        b = f.read(8)
        f.seek(8)
        f.write(bytes(x ^ 0x5A for x in b))
    subprocess.run([KC_ENTRY, "reseal", entry, payload], check=True)
    r, _, err = run_json([CL_DEMO, "--dir", d], {**pocl_env(tmp, "b"), "KCACHE_TRACE": "1"})
    assert r["err"] == 0 and r["checksum"] == cold["checksum"]
    assert (r["rejects"], r["compiles"]) == (1, 1)
    assert "the driver refused the cached binary" in err
    again, _, _ = run_json([CL_DEMO, "--dir", d], pocl_env(tmp, "c"))
    assert (again["hits"], again["compiles"], again["rejects"]) == (1, 0, 0)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_opencl_damaged_entry_is_a_miss(tmp, damage):
    d = os.path.join(tmp, "c")
    cold, _, _ = run_json([CL_DEMO, "--dir", d], pocl_env(tmp, "a"))
    [entry] = entries(d)
    size = os.path.getsize(entry)
    if damage == "truncate":
        os.truncate(entry, size - 1000)
    elif damage == "flip":
        with open(entry, "r+b") as f:
            f.seek(size // 2)
            c = f.read(1)
            f.seek(size // 2)
            f.write(bytes([c[0] ^ 0x10]))
    else:
        with open(entry, "wb") as f:
            f.write(os.urandom(size))
    r, _, err = run_json([CL_DEMO, "--dir", d], {**pocl_env(tmp, "b"), "KCACHE_TRACE": "1"})
    assert r["err"] == 0 and r["checksum"] == cold["checksum"]
    assert (r["rejects"], r["compiles"]) == (1, 1)
    assert "reject" in err


def test_opencl_eight_threads_build_once(tmp):
    r, _, _ = run_json([CL_DEMO, "--dir", os.path.join(tmp, "c"), "--threads", "8"], pocl_env(tmp, "a"))
    assert r["err"] == 0 and r["same"] is True
    assert (r["compiles"], r["memory_hits"]) == (1, 7)


def test_opencl_eight_processes_build_once(kfs, tmp):
    m = kfs({"max_size": "256M"})
    d = m.path("kcache")
    env = dict(os.environ)
    env.pop("KCACHE_TRACE", None)
    procs = []
    for i in range(8):
        e = dict(env, **pocl_env(tmp, f"p{i}"))
        procs.append(subprocess.Popen([CL_DEMO, "--dir", d], env=e, stdout=subprocess.PIPE, text=True))
    results = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert all(r["err"] == 0 for r in results)
    assert len({r["checksum"] for r in results}) == 1
    assert sum(r["compiles"] for r in results) == 1, results
    assert sum(r["hits"] for r in results) == 7
    assert sum(r["lock_waits"] for r in results) >= 1


def test_opencl_failed_build_same_error_and_log(tmp):
    d = os.path.join(tmp, "c")
    plain, _, _ = run_json([CL_DEMO, "--no-cache", "--break"], pocl_env(tmp, "a"))
    cached, _, _ = run_json([CL_DEMO, "--dir", d, "--break"], pocl_env(tmp, "b"))
    assert plain["err"] == cached["err"] == -11  # CL_BUILD_PROGRAM_FAILURE
    # PoCL names a temporary file of its own in the log: the rest must be identical.
    norm = lambda log: re.sub(r"\S*tempfile_\w+\.cl", "SRC", log)
    assert "undeclared_x" in plain["log"] and norm(cached["log"]) == norm(plain["log"])
    assert entries(d) == []  # a failure is not stored ...
    again, _, _ = run_json([CL_DEMO, "--dir", d, "--break"], pocl_env(tmp, "c"))
    assert again["compiles"] == 1  # ... nor remembered


def test_opencl_trace_shows_key_fields_and_decisions(tmp):
    d = os.path.join(tmp, "c")
    _, _, cold = run_json([CL_DEMO, "--dir", d, "--options", "-cl-mad-enable"],
                          {**pocl_env(tmp, "a"), "KCACHE_TRACE": "1"})
    for field in ("api", "kind", "input", "options", "platform.name", "platform.version", "device.vendor",
                  "device.name", "device.version", "driver.version"):
        assert f"  {field} " in cold, field
    assert '"-cl-mad-enable"' in cold
    assert "miss " in cold and "compile: CL_SUCCESS" in cold and "store " in cold
    trace = os.path.join(tmp, "trace.log")
    _, _, _ = run_json([CL_DEMO, "--dir", d, "--options", "-cl-mad-enable"],
                       {**pocl_env(tmp, "b"), "KCACHE_TRACE": trace})
    assert "hit " in open(trace).read()
    # Another option is another key: the trace of a miss shows which options it had.
    r, _, t = run_json([CL_DEMO, "--dir", d], {**pocl_env(tmp, "c"), "KCACHE_TRACE": "1"})
    assert r["compiles"] == 1 and '  options           ""' in t


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")
def test_entry_planted_by_another_user_is_never_loaded(tmp):
    """User B plants an entry under the exact path and key user A will use: A misses and compiles."""
    a, b = ensure_user("kcfs-usera"), ensure_user("kcfs-userb")
    shared = os.path.join(tmp, "shared")
    os.makedirs(shared)
    os.chmod(shared, 0o1777)
    rb, _, _ = run_json([CL_DEMO, "--dir", shared], pocl_env(tmp, "b"), user=b.pw_name)
    [entry] = entries(shared)
    assert os.stat(entry).st_uid == b.pw_uid
    # B's "binary" is a forged one: if A ever loaded it, A's results would differ or fail.
    payload = os.path.join(tmp, "payload")
    subprocess.run([KC_ENTRY, "payload", entry, payload], check=True)
    with open(payload, "r+b") as f:
        f.seek(os.path.getsize(payload) // 3)
        f.write(b"\xcc" * 64)
    subprocess.run([KC_ENTRY, "reseal", entry, payload], check=True)
    os.chown(entry, b.pw_uid, b.pw_gid)
    for d in glob.glob(os.path.join(shared, "*")) + glob.glob(os.path.join(shared, "*", "*")):
        if os.path.isdir(d):
            os.chmod(d, 0o1777)
    ra, _, err = run_json([CL_DEMO, "--dir", shared], {**pocl_env(tmp, "a"), "KCACHE_TRACE": "1"}, user=a.pw_name)
    assert ra["err"] == 0 and ra["checksum"] == rb["checksum"]
    assert (ra["hits"], ra["compiles"], ra["rejects"]) == (0, 1, 1)
    assert "owned by an untrusted user" in err
    assert os.stat(entry).st_uid == b.pw_uid  # sticky directory: A could not replace it either
    # A who trusts B (KCACHE_TRUST_UIDS) loads B's entries.
    trusting, _, _ = run_json([CL_DEMO, "--dir", shared], {**pocl_env(tmp, "a2"), "KCACHE_TRUST_UIDS": str(b.pw_uid)},
                              user=a.pw_name)
    assert trusting["hits"] == 1


def ze_env(tmp, **kw):
    e = {"ZE_ENABLE_ALT_DRIVERS": ZE_FAKE, "ZE_FAKE_COMPILE_LOG": os.path.join(tmp, "compiles.log"),
         "ZE_FAKE_COMPILE_MS": "300"}
    e.update(kw)
    return e


def ze_compiles(tmp):
    p = os.path.join(tmp, "compiles.log")
    return len(open(p).read().split()) if os.path.exists(p) else 0


def test_level_zero_cold_warm_through_the_real_loader(kfs, tmp):
    m = kfs({"max_size": "64M"})
    d = m.path("kcache")
    cold, _, _ = run_json([ZE_DEMO, "--dir", d], ze_env(tmp))
    assert cold["result"] == 0 and cold["kernel"].startswith("k_")
    assert (cold["compiles"], cold["stores"]) == (1, 1)
    [entry] = entries(d, "level-zero")
    assert os.path.basename(os.path.dirname(entry)).startswith("fake-gpu-9000-")
    warm, _, _ = run_json([ZE_DEMO, "--dir", d], ze_env(tmp))
    assert warm["kernel"] == cold["kernel"] and (warm["hits"], warm["compiles"]) == (1, 0)
    assert warm["create_ms"] * 10 < cold["create_ms"]
    assert ze_compiles(tmp) == 1
    # Every part of the key: a spec constant value, the build flags, the driver's version.
    for extra, env in ((["--spec", "6"], {}), (["--flags", "-ze-opt-level=1"], {}),
                       ([], {"ZE_FAKE_DRIVER_VERSION": "2"})):
        r, _, _ = run_json([ZE_DEMO, "--dir", d] + extra, ze_env(tmp, **env))
        assert r["compiles"] == 1, (extra, env)
    assert ze_compiles(tmp) == 4


def test_level_zero_native_binary_the_driver_rejects(tmp):
    d, other = os.path.join(tmp, "c"), os.path.join(tmp, "other")
    cold, _, _ = run_json([ZE_DEMO, "--dir", d], ze_env(tmp))
    run_json([ZE_DEMO, "--dir", other], ze_env(tmp, ZE_FAKE_DEVICE="Fake GPU 1"))
    [entry], [foreign] = entries(d, "level-zero"), entries(other, "level-zero")
    payload = os.path.join(tmp, "payload")
    subprocess.run([KC_ENTRY, "payload", foreign, payload], check=True)
    subprocess.run([KC_ENTRY, "reseal", entry, payload], check=True)  # another device's binary
    r, _, err = run_json([ZE_DEMO, "--dir", d], ze_env(tmp, KCACHE_TRACE="1"))
    assert r["result"] == 0 and r["kernel"] == cold["kernel"]
    assert (r["rejects"], r["compiles"]) == (1, 1)
    assert "the driver refused the native binary" in err
    again, _, _ = run_json([ZE_DEMO, "--dir", d], ze_env(tmp))
    assert (again["hits"], again["compiles"]) == (1, 0)


def test_level_zero_failed_build_log_and_no_entry(tmp):
    d = os.path.join(tmp, "c")
    plain, _, _ = run_json([ZE_DEMO, "--no-cache", "--break"], ze_env(tmp))
    r, _, _ = run_json([ZE_DEMO, "--dir", d, "--break"], ze_env(tmp))
    assert r["result"] == plain["result"] == 0x70000004  # ZE_RESULT_ERROR_MODULE_BUILD_FAILURE
    assert "BROKEN" in r["log"] and r["log"] == plain["log"]
    assert entries(d, "level-zero") == []


def test_level_zero_single_flight_threads_and_processes(tmp):
    r, _, _ = run_json([ZE_DEMO, "--dir", os.path.join(tmp, "t"), "--threads", "8"], ze_env(tmp))
    assert r["same"] is True and r["compiles"] == 1 and ze_compiles(tmp) == 1
    env = dict(os.environ, **ze_env(tmp, ZE_FAKE_COMPILE_MS="1000"))
    procs = [subprocess.Popen([ZE_DEMO, "--dir", os.path.join(tmp, "p")], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(8)]
    res = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert {x["kernel"] for x in res} == {r["kernel"]}
    assert sum(x["compiles"] for x in res) == 1 and ze_compiles(tmp) == 2


def test_pkgconfig_from_the_build_directory(tmp):
    """An application builds against libkcache straight from the build directory."""
    plain = os.path.join(ROOT, "build")  # not build-asan: an application built without -fsanitize
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(plain, "meson-uninstalled"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "kcache-opencl"], env=env, capture_output=True,
                           text=True, check=True).stdout.split()
    exe = os.path.join(tmp, "app")
    src = os.path.join(ROOT, "tests", "helpers", "kc-cl-demo.c")
    suite = os.path.join(ROOT, "tests", "helpers", "kernels", "suite.cl")
    subprocess.run(["cc", "-o", exe, src, f'-DKC_DEMO_SOURCE="{suite}"', "-pthread"] + flags, check=True)
    libdirs = [f[2:] for f in flags if f.startswith("-L")]
    r, _, _ = run_json([exe, "--dir", os.path.join(tmp, "c")],
                       {**pocl_env(tmp, "a"), "LD_LIBRARY_PATH": ":".join(libdirs)})
    assert r["err"] == 0 and r["compiles"] == 1
    ze = subprocess.run(["pkg-config", "--exists", "--print-errors", "kcache", "kcache-level-zero"], env=env)
    assert ze.returncode == 0


def test_kcache_show_decodes_entries(tmp):
    kcache = os.path.join(BUILD, "kcache")
    d = os.path.join(tmp, "c")
    run_json([ZE_DEMO, "--dir", d, "--spec", "7"], ze_env(tmp))
    [entry] = entries(d, "level-zero")
    p = subprocess.run([kcache, "show", entry], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    for want in ('api               "level-zero"', "spec              id 1 = 07 00 00 00",
                 'device.name       "Fake GPU 9000"', "matches the file name", "verdict           ok",
                 "payload           32 bytes"):
        assert want in p.stdout, want
    os.truncate(entry, os.path.getsize(entry) - 3)
    p = subprocess.run([kcache, "show", entry], capture_output=True, text=True)
    assert p.returncode == 1 and "verdict           truncated" in p.stdout
    other = os.path.join(tmp, "not-an-entry")
    open(other, "wb").write(b"poclbin\0" + b"x" * 100)
    p = subprocess.run([kcache, "show", other], capture_output=True, text=True)
    assert p.returncode == 1 and "not a libkcache entry" in p.stdout
    p = subprocess.run([kcache, "show", os.path.join(tmp, "missing")], capture_output=True, text=True)
    assert p.returncode == 1 and "No such file" in p.stderr
