"""The README's quick start, as typed: ./quickstart builds, installs and mounts, and prints the lines of
`kcache env`; a second run keeps the mount; --uninstall unmounts and removes what was installed. It
installs into a scratch prefix (PREFIX) from a build directory of its own, so nothing of the machine or of
the suite's builds changes. Run once, in the plain pass (it builds its own release build)."""
import os
import shutil
import subprocess
import tempfile

import pytest

from conftest import kcachefs_bin

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(900)
def test_quickstart_installs_mounts_prints_kcache_env_and_uninstalls():
    if "asan" in kcachefs_bin():
        pytest.skip("the quick start builds its own release build: once, in the plain pass")
    tmp = tempfile.mkdtemp(prefix="kcachefs-qs-")
    prefix, backing, mnt = (os.path.join(tmp, n) for n in ("prefix", "backing", "mnt"))
    env = dict(os.environ, PREFIX=prefix, KCACHEFS_BUILDDIR=os.path.join(tmp, "build"),
               KCACHEFS_OPTIONS="max_size=8M")
    qs = [os.path.join(ROOT, "quickstart")]
    try:
        first = subprocess.run(qs + [backing, mnt], env=env, capture_output=True, text=True, timeout=800)
        assert first.returncode == 0, first.stdout + first.stderr
        assert os.path.ismount(mnt)
        for f in ("sbin/kcachefs", "bin/kcache", "share/man/man8/kcachefs.8", "share/man/man1/kcache.1",
                  "share/man/man3/libkcache.3", "include/kcache.h"):
            assert os.path.exists(os.path.join(prefix, f)), f
        kcache = os.path.join(prefix, "bin", "kcache")
        lines = subprocess.run([kcache, "env", mnt], capture_output=True, text=True, check=True).stdout
        assert lines.strip() and lines.strip() in first.stdout, first.stdout
        assert int(os.getxattr(mnt, "user.kcachefs.max_bytes")) == 8 << 20  # the options reached the daemon
        lock = os.path.join(backing, ".kcachefs", "index.db.lock")  # the daemon's pid
        pid = open(lock).read().split()[0]

        again = subprocess.run(qs + [backing, mnt], env=env, capture_output=True, text=True, timeout=800)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "already mounted" in again.stdout and lines.strip() in again.stdout, again.stdout
        assert open(lock).read().split()[0] == pid  # the same daemon

        record = os.path.join(prefix, "share", "kcachefs", "installed-files")
        installed = [f for f in open(record).read().split("\n") if f]
        assert len(installed) > 10
        gone = subprocess.run(qs + ["--uninstall", mnt], env=env, capture_output=True, text=True, timeout=120)
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert not os.path.ismount(mnt)
        left = [f for f in installed if os.path.lexists(f)]
        assert not left, left
        assert os.path.isdir(backing)
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", mnt])
        shutil.rmtree(tmp, ignore_errors=True)
