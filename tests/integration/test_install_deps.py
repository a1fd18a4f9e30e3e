"""scripts/install-deps as a user's machine runs it, with apt-get and dpkg-query stood in for (nothing is
installed): without --tests it asks for what building and running need and none of the test world; with
--tests, the test world too; and a lock another apt holds (a boot-time `apt-get update` holds the lists
lock, a download the archives lock; DPkg::Lock::Timeout waits only for dpkg's) is waited for, not failed
on, and said."""
import os
import re
import subprocess

import pytest

from conftest import ROOT

# Not root, the script runs apt-get through sudo, which resets PATH: the real apt-get would run.
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="install-deps runs apt-get itself only as root")

SCRIPT = os.path.join(ROOT, "scripts", "install-deps")
# What only the tests use: none of it may come without --tests (the issue: 39 packages, valgrind, clang, numba).
TEST_WORLD = {"valgrind", "clang", "python3-numba", "python3-pytest", "pocl-opencl-icd", "redis-server", "lintian",
              "ccache", "mergerfs", "bindfs", "stunnel4"}


def stubs(d, locked_calls=0):
    """A bin directory with apt-get and dpkg-query: dpkg-query knows no package; apt-get logs its arguments
    and, for its first LOCKED_CALLS calls, fails as apt does when another apt holds a lock."""
    b = os.path.join(d, "bin")
    os.makedirs(b)
    with open(os.path.join(b, "dpkg-query"), "w") as f:
        f.write("#!/bin/sh\nexit 1\n")
    with open(os.path.join(b, "apt-get"), "w") as f:
        f.write(f"""#!/bin/sh
n=$(cat {d}/count 2>/dev/null || echo 0); n=$((n + 1)); echo $n >{d}/count
if [ $n -le {locked_calls} ]; then
  echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)" >&2
  echo "E: Unable to lock directory /var/lib/apt/lists/" >&2
  exit 100
fi
echo "$*" >>{d}/calls
case " $* " in *" download "*) exit 100 ;; esac
exit 0
""")
    for n in ("dpkg-query", "apt-get"):
        os.chmod(os.path.join(b, n), 0o755)
    return b


def run(d, b, *args, timeout=120):
    env = dict(os.environ, PATH=f"{b}:/usr/bin:/bin:/usr/sbin:/sbin")
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=timeout, env=env)


def installed(d):
    calls = open(os.path.join(d, "calls")).read().splitlines()
    pkgs = set()
    for c in calls:
        if " install " in f" {c} ":
            pkgs |= {w for w in c.split(" install ", 1)[1].split() if not w.startswith("-")}
    return calls, pkgs


def test_without_tests_only_what_building_and_running_need(tmp_path):
    d = str(tmp_path)
    p = run(d, stubs(d))
    assert p.returncode == 0, p.stderr
    calls, pkgs = installed(d)
    assert {"meson", "gcc", "libfuse3-dev", "fuse3", "libsqlite3-dev", "libjson-c-dev", "libinih-dev"} <= pkgs, pkgs
    assert not pkgs & TEST_WORLD, pkgs & TEST_WORLD
    assert len(pkgs) < 20, pkgs
    assert not [c for c in calls if " download " in f" {c} "], calls  # promtool is the tests'


def test_with_tests_the_test_world_too(tmp_path):
    d = str(tmp_path)
    p = run(d, stubs(d), "--tests")
    assert p.returncode == 0, p.stderr
    _, pkgs = installed(d)
    assert TEST_WORLD <= pkgs, TEST_WORLD - pkgs


def test_a_lock_another_apt_holds_is_waited_for(tmp_path):
    """`apt-get update` fails at once on /var/lib/apt/lists/lock whatever DPkg::Lock::Timeout says (apt
    2.6: seen with the lock held, rc 100 in 35 ms): the quick start at boot must wait, and say so."""
    d = str(tmp_path)
    p = run(d, stubs(d, locked_calls=2))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "waiting" in p.stderr and "lock" in p.stderr, p.stderr
    calls, pkgs = installed(d)
    assert " update " in f" {calls[0]} " and "meson" in pkgs, calls
    for c in calls:  # dpkg's own lock: apt waits for it itself
        assert re.search(r"-o DPkg::Lock::Timeout=\d+", c), c
