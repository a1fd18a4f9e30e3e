"""The shared tier under libkcache's OpenCL layer (OPENCL_LAYERS=libkcache-layer.so) over real PoCL: what a
plain OpenCL program compiled through one node is loaded on another without compiling, and eight such
processes over four nodes compile once (libkcache's lock on each node, the herd across them)."""
import json
import os
import subprocess

import pytest

from conftest import wait_for
from test_cli_kcache import kcache
from test_opencl_layer import PLAIN, layer_env
from test_client_libkcache import run_json
from test_remote import node, num, redis  # noqa: F401 (redis: the fixture)

pytestmark = pytest.mark.skipif(not os.path.exists(PLAIN) or not os.path.exists("/etc/OpenCL/vendors/pocl.icd"),
                                reason="needs PoCL and build/tests/cl-plain")


def layer_node(kfs, redis, **opts):
    m = node(kfs, redis, **opts)
    kcache("env", m.mnt, "kcache")  # KCACHE_DIR=MOUNT/kcache, marked as libkcache's
    return m


def test_a_program_built_through_the_layer_on_one_node_loads_on_another(kfs, redis, tmp):
    a, b = layer_node(kfs, redis), layer_node(kfs, redis)
    ta, tb = os.path.join(tmp, "a.trace"), os.path.join(tmp, "b.trace")
    cold, _, _ = run_json([PLAIN], layer_env(tmp, "a", a.path("kcache"), ta))
    assert cold["err"] == 0 and "compile: CL_SUCCESS" in open(ta).read()
    wait_for(lambda: num(a, "remote_publishes") >= 1, timeout=30, what="the entry published")
    warm, _, _ = run_json([PLAIN], layer_env(tmp, "b", b.path("kcache"), tb))  # PoCL's own cache empty too
    t = open(tb).read()
    assert "hit " in t and "compile:" not in t, t  # libkcache's trace: B loaded A's binary, built nothing
    assert warm["err"] == 0 and warm["checksum"] == cold["checksum"]
    assert num(b, "remote_hits") >= 1 and num(b, "remote_publishes") == 0
    assert "matches" in kcache("verify", b.mnt).stdout


def test_eight_layer_processes_on_four_nodes_compile_once(kfs, redis, tmp):
    nodes = [layer_node(kfs, redis, herd_wait="60") for _ in range(4)]
    procs = []
    for i in range(8):
        m = nodes[i % 4]
        env = dict(os.environ, **layer_env(tmp, f"p{i}", m.path("kcache"), os.path.join(tmp, f"p{i}.trace")))
        env.pop("KCACHE_TRACE_FD", None)
        procs.append(subprocess.Popen([PLAIN], env=env, stdout=subprocess.PIPE, text=True))
    res = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert all(r["err"] == 0 for r in res) and len({r["checksum"] for r in res}) == 1
    traces = [open(os.path.join(tmp, f"p{i}.trace")).read() for i in range(8)]
    assert sum(t.count("compile: CL_SUCCESS") for t in traces) == 1, [t.count("compile:") for t in traces]
    assert sum(t.count("hit ") for t in traces) == 7
    assert sum(num(m, "herd_waits") for m in nodes) >= 1
    for m in nodes:
        assert "matches" in kcache("verify", m.mnt).stdout
