"""Fixtures for the integration tests: they mount the real kcachefs daemon.

Every mount is waited for against a deadline and always unmounted (fusermount3 -u -z), even when a
test fails. Backing directories live on a tmpfs mounted noatime, as the issue asks, so that an exact
st_atime can only come from kcachefs's own access log.
"""
import os
import pwd
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def kcachefs_bin():
    b = os.environ.get("KCACHEFS_BIN")
    if b:
        return b
    for cand in ("build/kcachefs", "build-asan/kcachefs"):
        p = os.path.join(ROOT, cand)
        if os.path.exists(p):
            return p
    pytest.fail("kcachefs binary not found: build it or set KCACHEFS_BIN")


def wait_for(cond, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Mount:
    """One kcachefs mount: start(), stop() (clean), kill() (SIGKILL), remount."""

    def __init__(self, backing, mnt, opts=None, index=None):
        self.backing = backing
        self.mnt = mnt
        self.opts = dict(opts or {})
        self.index = index
        self.stderr = ""

    @property
    def index_path(self):
        return self.index or os.path.join(self.backing, ".kcachefs", "index.db")

    def args(self, extra=()):
        o = []
        # KCACHEFS_MOUNT_OPTS (k or k=v, comma-separated) applies to every mount that does not set the
        # same key itself; run-tests runs the suite once in each read mode with it. A key set to False
        # is left out: a test that needs passthrough sets nopassthrough=False.
        opts = dict(self.opts)
        for kv in filter(None, os.environ.get("KCACHEFS_MOUNT_OPTS", "").split(",")):
            k, _, v = kv.partition("=")
            opts.setdefault(k, v if v else True)
        for k, v in opts.items():
            if v is False:
                continue
            o.append(k if v is True else f"{k}={v}")
        if self.index:
            o.append(f"index={self.index}")
        cmd = [kcachefs_bin()]
        if o:
            cmd += ["-o", ",".join(o)]
        return cmd + list(extra) + [self.backing, self.mnt]

    def start(self, extra=(), check=True):
        p = subprocess.run(self.args(extra), capture_output=True, text=True, timeout=120)
        self.stderr = p.stderr
        if check:
            assert p.returncode == 0, f"kcachefs failed: {p.stderr}"
            wait_for(lambda: os.path.ismount(self.mnt), what="mount")
        return p

    def pid(self):
        with open(self.index_path + ".lock") as f:
            return int(f.read().strip())

    def stop(self):
        if os.path.ismount(self.mnt):
            pid = self.pid()
            subprocess.run(["fusermount3", "-u", self.mnt], check=False, capture_output=True)
            if os.path.ismount(self.mnt):
                subprocess.run(["fusermount3", "-u", "-z", self.mnt], check=False, capture_output=True)
            # The daemon flushes and marks the index clean after the unmount: wait until it is gone.
            wait_for(lambda: not pid_alive(pid), timeout=30, what="daemon exit")

    def kill(self):
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), what="daemon death")
        subprocess.run(["fusermount3", "-u", "-z", self.mnt], check=False, capture_output=True)
        wait_for(lambda: not os.path.ismount(self.mnt), what="unmount")

    def path(self, *p):
        return os.path.join(self.mnt, *p)

    def used(self):
        s = os.statvfs(self.mnt)
        return (s.f_blocks - s.f_bfree) * s.f_frsize

    def index_rows(self):
        """{relative path: bytes} from the index (only while unmounted or flushed)."""
        db = sqlite3.connect(f"file:{self.index_path}?mode=ro", uri=True)
        try:
            root = db.execute("SELECT v FROM meta WHERE k = 'root_ino'").fetchone()[0]
            dents = db.execute("SELECT dir, name, ino, type FROM dents").fetchall()
            files = dict(db.execute("SELECT ino, bytes FROM files").fetchall())
        finally:
            db.close()
        parent = {ino: (d, n) for d, n, ino, t in dents if t == 2}

        def path_of(d, n):
            parts = [n]
            while d != root:
                d, pn = parent[d]
                parts.append(pn)
            return "/".join(reversed(parts))

        return {path_of(d, n): files.get(ino) for d, n, ino, t in dents if t == 1}


def ensure_user(name):
    """The passwd entry of a test user, created (no home, no login shell) the first time."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
        return pwd.getpwnam(name)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def backing_files(backing):
    """{relative path: allocated bytes} of the regular files in a backing directory."""
    out = {}
    for dp, dns, fns in os.walk(backing):
        rel = os.path.relpath(dp, backing)
        if rel == ".":
            dns[:] = [d for d in dns if d != ".kcachefs"]
        for fn in fns:
            st = os.lstat(os.path.join(dp, fn))
            if not os.path.islink(os.path.join(dp, fn)):
                out[os.path.normpath(os.path.join(rel, fn))] = st.st_blocks * 512
    return out


@pytest.fixture
def workdir():
    """A world-traversable scratch directory (tests run other users through it)."""
    d = tempfile.mkdtemp(prefix="kcachefs-it-")
    os.chmod(d, 0o755)
    mounts = []
    yield d, mounts
    for m in mounts:
        subprocess.run(["fusermount3", "-u", "-z", m], capture_output=True)
    for m in mounts:
        subprocess.run(["umount", "-l", m], capture_output=True)
    if not os.environ.get("KCACHEFS_KEEP"):
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def tmp():
    """A scratch directory on the ordinary filesystem, traversable by test users."""
    d = tempfile.mkdtemp(prefix="kcache-client-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def mount_tmpfs(path, size="256m", extra="noatime"):
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},{extra}", "tmpfs", path], check=True)


@pytest.fixture
def kfs(workdir):
    """Factory: kfs(opts) -> a started Mount with its backing directory on a noatime tmpfs."""
    d, cleanup = workdir
    made = []

    def make(opts=None, start=True, tmpfs_size="256m", index=None):
        i = len(made)
        backing = os.path.join(d, f"backing{i}")
        mnt = os.path.join(d, f"mnt{i}")
        mount_tmpfs(backing, tmpfs_size)
        os.chmod(backing, 0o755)
        os.makedirs(mnt)
        cleanup.insert(0, backing)
        m = Mount(backing, mnt, opts, index)
        made.append(m)
        cleanup.insert(0, mnt)
        if start:
            m.start()
        return m

    yield make
    for m in made:
        try:
            if os.path.ismount(m.mnt):
                m.stop()
        except Exception:
            pass
