"""The OpenCL layer (OPENCL_LAYERS=libkcache-layer.so) under a plain OpenCL program that does not link
libkcache, with real PoCL and the real ICD loader: cold then warm on a kcachefs mount, the program as
the application sees it, failed builds, single flight across processes, entries shared with the
library."""
import json
import os
import re
import subprocess

from conftest import ROOT
from test_client_libkcache import CL_DEMO, entries, pocl_env, run_json

BUILD = os.environ.get("KCACHE_BUILD") or os.path.join(ROOT, "build")  # run-tests: build-asan in its ASan pass
PLAIN = os.path.join(BUILD, "tests", "cl-plain")
LAYER = os.path.join(BUILD, "layer", "libkcache-layer.so")


def layer_env(tmp, tag, d, trace=None):
    e = {**pocl_env(tmp, tag), "OPENCL_LAYERS": LAYER, "KCACHE_DIR": d}
    if trace:
        e["KCACHE_TRACE"] = trace
    return e


def test_the_program_does_not_link_libkcache():
    out = subprocess.run(["ldd", PLAIN], capture_output=True, text=True, check=True).stdout
    assert "libOpenCL" in out and "kcache" not in out


def test_layer_cold_then_warm_on_a_mount(kfs, tmp):
    m = kfs({"max_size": "256M"})
    d = m.path("kcache")
    trace = os.path.join(tmp, "cold.trace")
    cold, cold_wall, _ = run_json([PLAIN], layer_env(tmp, "cold", d, trace))
    assert cold["err"] == 0 and cold["kernels"] == 14
    t = open(trace).read()
    assert "miss " in t and "compile: CL_SUCCESS" in t and "store " in t and "refresh " in t
    assert len(entries(d)) == 1
    trace = os.path.join(tmp, "warm.trace")
    warm, warm_wall, _ = run_json([PLAIN], layer_env(tmp, "warm", d, trace))
    t = open(trace).read()
    assert "hit " in t and "compile:" not in t
    assert warm["checksum"] == cold["checksum"]
    # At least 10x faster end to end (process start to exit, as the user waits for it).
    assert warm_wall * 10 <= cold_wall, (cold_wall, warm_wall)
    uncached, _, _ = run_json([PLAIN], pocl_env(tmp, "plain"))
    assert uncached["checksum"] == cold["checksum"]
    print(f"\nlayer: cold {cold_wall:.3f}s (first result {cold['first_result_ms']:.0f} ms), warm {warm_wall:.3f}s "
          f"(first result {warm['first_result_ms']:.0f} ms): {cold_wall / warm_wall:.0f}x")


def test_layer_program_answers_as_the_driver_would(tmp):
    d = os.path.join(tmp, "c")
    plain, _, _ = run_json([PLAIN], pocl_env(tmp, "a"))
    run_json([PLAIN], layer_env(tmp, "b", d))
    warm, _, _ = run_json([PLAIN], layer_env(tmp, "c", d))
    for k in ("checksum", "kernels", "num_kernels", "kernel_names", "source_len", "build_status"):
        assert warm[k] == plain[k], k
    assert warm["kernel_program_ok"] == plain["kernel_program_ok"] == 1  # CL_KERNEL_PROGRAM is the app's


def test_layer_failed_build_same_error_and_log(tmp):
    d = os.path.join(tmp, "c")
    plain, _, _ = run_json([PLAIN, "--break"], pocl_env(tmp, "a"))
    layered, _, _ = run_json([PLAIN, "--break"], layer_env(tmp, "b", d))
    norm = lambda log: re.sub(r"\S*tempfile_\w+\.cl", "SRC", log)
    assert plain["err"] == layered["err"] == -11
    assert "undeclared_x" in plain["log"] and norm(layered["log"]) == norm(plain["log"])
    assert plain["build_status"] == layered["build_status"] == -2  # CL_BUILD_ERROR
    assert entries(d) == []


def test_layer_eight_processes_compile_once(kfs, tmp):
    m = kfs({"max_size": "256M"})
    d = m.path("kcache")
    procs = []
    for i in range(8):
        env = dict(os.environ, **layer_env(tmp, f"p{i}", d, os.path.join(tmp, f"p{i}.trace")))
        procs.append(subprocess.Popen([PLAIN], env=env, stdout=subprocess.PIPE, text=True))
    res = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert len({r["checksum"] for r in res}) == 1 and all(r["err"] == 0 for r in res)
    traces = [open(os.path.join(tmp, f"p{i}.trace")).read() for i in range(8)]
    assert sum(t.count("compile: CL_SUCCESS") for t in traces) == 1
    assert sum(t.count("hit ") for t in traces) == 7


def test_layer_and_library_share_entries(tmp):
    d = os.path.join(tmp, "c")
    run_json([PLAIN], layer_env(tmp, "a", d))
    lib, _, _ = run_json([CL_DEMO, "--dir", d], pocl_env(tmp, "b"))
    assert (lib["hits"], lib["compiles"]) == (1, 0)


def test_children_inherit_only_the_first_layer_path(tmp):
    """What the README says: ocl-icd cuts OPENCL_LAYERS to its first path in the process's environment,
    which its children inherit. So the kcache layer must come first."""
    code = ("import ctypes\n"
            "libc = ctypes.CDLL(None); libc.getenv.restype = ctypes.c_char_p\n"
            "n = ctypes.c_uint()\n"
            "ctypes.CDLL('libOpenCL.so.1').clGetPlatformIDs(0, None, ctypes.byref(n))\n"
            "print(libc.getenv(b'OPENCL_LAYERS').decode())\n")
    layer = os.path.join(ROOT, "build", "layer", "libkcache-layer.so")  # python has no ASan runtime
    env = dict(os.environ, **pocl_env(tmp, "a"), OPENCL_LAYERS=f"{layer}:/nonexistent/second-layer.so",
               KCACHE_DIR=os.path.join(tmp, "c"))
    out = subprocess.run(["/usr/bin/python3", "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == layer
