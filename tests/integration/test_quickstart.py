"""The README's quick start, as typed: ./quickstart builds, installs and mounts, and prints the lines of
`kcache env`; a second run keeps the mount; --uninstall unmounts the mount it made (and no other), refuses
while that mount is busy, and removes what was installed and the directories it made. It
installs into a scratch prefix (PREFIX) from a build directory of its own, so nothing of the machine or of
the suite's builds changes. Run once, in the plain pass (it builds its own release build)."""
import os
import shutil
import subprocess
import tempfile

import pytest

from conftest import kcachefs_bin, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(900)
def test_quickstart_installs_mounts_prints_kcache_env_and_uninstalls():
    if "asan" in kcachefs_bin():
        pytest.skip("the quick start builds its own release build: once, in the plain pass")
    tmp = tempfile.mkdtemp(prefix="kcachefs-qs-")
    prefix, backing, mnt, home = (os.path.join(tmp, n) for n in ("prefix", "backing", "mnt", "home"))
    # Someone else's cache where quick start mounts by default (~/.cache/kcachefs/mnt): never its to touch.
    theirs = os.path.join(home, ".cache", "kcachefs")
    os.makedirs(theirs, mode=0o700)
    os.chmod(theirs, 0o700)
    other_mnt, other_backing = os.path.join(theirs, "mnt"), os.path.join(theirs, "backing")
    os.makedirs(other_mnt)
    os.makedirs(other_backing)
    env = dict(os.environ, PREFIX=prefix, KCACHEFS_BUILDDIR=os.path.join(tmp, "build"),
               KCACHEFS_OPTIONS="max_size=8M", HOME=home)
    qs = [os.path.join(ROOT, "quickstart")]
    try:
        subprocess.run([kcachefs_bin(), "-o", "max_size=4M", other_backing, other_mnt], check=True, timeout=60)
        wait_for(lambda: os.path.ismount(other_mnt), what="the other mount")
        # An uninstall where nothing was installed touches nothing, that mount included.
        nothing = subprocess.run(qs + ["--uninstall"], env=dict(env, PREFIX=os.path.join(tmp, "empty")),
                                 capture_output=True, text=True, timeout=120)
        assert nothing.returncode != 0 and "nothing recorded" in nothing.stderr, nothing.stdout + nothing.stderr
        assert os.path.ismount(other_mnt)

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
        # Busy: the mount cannot go, so nothing goes (no daemon left running from a deleted binary).
        with open(os.path.join(mnt, "held"), "wb") as held:
            busy = subprocess.run(qs + ["--uninstall"], env=env, capture_output=True, text=True, timeout=120)
            assert busy.returncode != 0 and "nothing removed" in busy.stderr, busy.stdout + busy.stderr
            assert os.path.ismount(mnt) and os.path.ismount(other_mnt)
            assert not [f for f in installed if not os.path.lexists(f)]
        # Another mount named is refused: only the recorded one is this install's.
        wrong = subprocess.run(qs + ["--uninstall", other_mnt], env=env, capture_output=True, text=True, timeout=120)
        assert wrong.returncode != 0 and "not the mount this install made" in wrong.stderr, wrong.stderr
        assert os.path.ismount(other_mnt) and os.path.ismount(mnt)

        gone = subprocess.run(qs + ["--uninstall"], env=env, capture_output=True, text=True, timeout=120)
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert not os.path.ismount(mnt)
        assert os.path.ismount(other_mnt), "the uninstall unmounted a cache it did not make"
        left = [f for f in installed if os.path.lexists(f)]
        assert not left, left
        # The directories it made go too: the prefix (made by the install) and the mountpoint.
        assert not os.path.exists(prefix), subprocess.run(["find", prefix], capture_output=True, text=True).stdout
        assert not os.path.exists(mnt)
        assert os.path.isdir(backing)
    finally:
        for d in (mnt, other_mnt):
            if os.path.ismount(d):
                subprocess.run(["fusermount3", "-u", "-z", d])
        shutil.rmtree(tmp, ignore_errors=True)
