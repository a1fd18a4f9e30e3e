"""Fixtures for the integration tests: they mount the real kcachefs daemon.

Every mount is waited for against a deadline and always unmounted (fusermount3 -u -z), even when a
test fails. Backing directories live on a tmpfs mounted noatime, as the issue asks, so that an exact
st_atime can only come from kcachefs's own access log.
"""
import contextlib
import os
import pwd
import shutil
import signal
import sqlite3
import stat
import subprocess
import tempfile
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def kcache_bin():
    """The kcache of the build under test: $KCACHE_BIN, else $KCACHE_BUILD's (run-tests: build-asan in its
    ASan pass), else build/."""
    return os.environ.get("KCACHE_BIN") or os.path.join(ROOT, os.environ.get("KCACHE_BUILD", "build"), "kcache")


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
            return int(f.read().split()[0])

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
        """The daemon's own count of the cache's bytes, unclamped (statfs of the mount clamps Used at
        the limit, so an assert on it could never see the limit crossed)."""
        return int(os.getxattr(self.mnt, "user.kcachefs.used_bytes"))

    def df_used(self):
        """Used as df shows it: statfs of the mount, which never shows more than the limit."""
        s = os.statvfs(self.mnt)
        return (s.f_blocks - s.f_bfree) * s.f_frsize

    def assert_within(self, limit):
        """The limit holds by the daemon's count and on the disk: the regular files of the backing tree
        (what the cache holds) and evicted files whose blocks the reaper has yet to free are bounded."""
        used = self.used()
        assert used <= limit, f"the daemon counts {used} bytes, over the limit of {limit}"
        tree = backing_bytes(self.backing)
        assert tree <= limit, f"the backing tree holds {tree} bytes, over the limit of {limit}"
        return used

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


def proc_state(pid):
    """The one-letter state of a process (R, S, T, Z ...) from /proc/PID/stat; FileNotFoundError once it is gone."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        return proc_state(pid) != "Z"
    except FileNotFoundError:
        return False


def backing_bytes(backing):
    """The bytes the regular files of a backing directory hold: each inode once, however many links.
    A walk is no snapshot: while files are written it may count one that eviction removed after it was
    counted and the one written in its place, two files that were never there together. Under load, walk
    with the writers held back (WriteGate)."""
    seen = {}
    for dp, dns, fns in os.walk(backing):
        if dp == backing:
            dns[:] = [d for d in dns if d != ".kcachefs"]
        for fn in fns:
            try:
                st = os.lstat(os.path.join(dp, fn))
            except FileNotFoundError:
                continue  # evicted while the walk went on
            if not stat.S_ISLNK(st.st_mode):
                seen[st.st_ino] = st.st_blocks * 512
    return sum(seen.values())


class WriteGate:
    """Writers pass it together, a sampler alone (a readers-writer lock), for threads or forked processes.
    With the writers held between two of their writes, the tree only shrinks (eviction, the reaper) while
    the sampler walks it, so the walk's sum is at most what the tree held when the walk began: an exact
    upper bound, where a walk racing the writers can count a file and its replacement both (backing_bytes).
    """

    def __init__(self, ctx=None):
        import multiprocessing
        ctx = ctx or multiprocessing.get_context("fork")
        self.cond = ctx.Condition()
        self.active = ctx.RawValue("i", 0)  # writers inside
        self.held = ctx.RawValue("i", 0)  # a sampler holds the gate

    @contextlib.contextmanager
    def writing(self):
        with self.cond:
            while self.held.value:
                self.cond.wait()
            self.active.value += 1
        try:
            yield
        finally:
            with self.cond:
                self.active.value -= 1
                self.cond.notify_all()

    @contextlib.contextmanager
    def quiet(self):
        with self.cond:
            self.held.value = 1
            while self.active.value:
                self.cond.wait()
        try:
            yield
        finally:
            with self.cond:
                self.held.value = 0
                self.cond.notify_all()


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


# Every test has a deadline (pytest.ini; @pytest.mark.timeout(N) for a longer one). A little before it, the
# watchdog aborts the FUSE connections of the test's mounts: whatever the test (or a daemon's client) is
# blocked on in a wedged mount returns ENOTCONN, the test fails with its own traceback, and the fixtures
# unmount as usual. pytest-timeout (thread method) is the last resort: it ends the whole run.
WATCHDOG_MARGIN = 30


def fuse_connections(prefix):
    """{mount point: connection id} of the FUSE mounts whose path starts with prefix (from mountinfo,
    which needs no request to the mounts themselves, so it works on a wedged one)."""
    out = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            a = line.split()
            sep = a.index("-")
            if a[sep + 1].startswith("fuse") and a[4].startswith(prefix):
                major, minor = a[2].split(":")
                if major == "0":
                    out[a[4]] = int(minor)
    return out


def abort_test_mounts():
    """Ends the mounts the tests made (in their kcachefs-it-*/kcache-* scratch directories), and only
    those: aborts each connection (fusectl) and SIGKILLs its daemon, since requests a daemon holds in its
    io_uring entries end only when its rings go. Returns the mount points."""
    conns = "/sys/fs/fuse/connections"
    if os.path.isdir(conns) and not os.listdir(conns):
        subprocess.run(["mount", "-t", "fusectl", "fusectl", conns], capture_output=True)
    mounts = fuse_connections(os.path.join(tempfile.gettempdir(), "kcache"))
    for mnt, conn in mounts.items():
        try:
            with open(f"{conns}/{conn}/abort", "w") as f:
                f.write("1")
        except OSError:
            pass
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]).startswith(b"kcachefs") and \
                any(a.decode(errors="replace") in mounts for a in argv):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    return list(mounts)


@pytest.fixture(autouse=True)
def deadline(request):
    m = request.node.get_closest_marker("timeout")
    limit = float(m.args[0]) if m and m.args else float(request.config.getini("timeout") or 600)
    fired = []

    def fire():
        fired.extend(abort_test_mounts() or ["(no mount)"])

    t = threading.Timer(max(limit - WATCHDOG_MARGIN, 1), fire)
    t.daemon = True
    t.start()
    yield
    t.cancel()
    if fired:
        pytest.fail(f"the test passed its deadline ({limit - WATCHDOG_MARGIN:.0f}s): aborted the FUSE connections "
                    f"of {fired}")


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


def mount_ext4(path, size="256m", extra="noatime"):
    """ext4 on a loop image beside path: what tmpfs lacks (delayed allocation, O_DIRECT's alignment,
    extent blocks allocated at writeback, hole punching on disk blocks). The image is sparse."""
    os.makedirs(path, exist_ok=True)
    img = path + ".img"
    subprocess.run(["truncate", "-s", size, img], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", img], check=True)
    subprocess.run(["mount", "-t", "ext4", "-o", f"loop,{extra}", img, path], check=True)


def private_dir(d, owner=None):
    """D/private: mode 0700, owned by root (or the passwd entry OWNER), where backing directories and
    indexes go. kcachefs refuses a backing directory that other users can reach by its path (fs/reach.c);
    mount points stay in D, which other users can traverse."""
    p = os.path.join(d, "private" if owner is None else f"private-{owner.pw_name}")
    os.makedirs(p, mode=0o700, exist_ok=True)
    os.chmod(p, 0o700)
    if owner is not None:
        os.chown(p, owner.pw_uid, owner.pw_gid)
    return p


@pytest.fixture
def kfs(workdir):
    """Factory: kfs(opts) -> a started Mount with its backing directory on a noatime tmpfs, inside
    workdir's private directory (private_dir); the mount point beside it, reachable by every user."""
    d, cleanup = workdir
    made = []

    def make(opts=None, start=True, tmpfs_size="256m", index=None, fs="tmpfs"):
        i = len(made)
        backing = os.path.join(private_dir(d), f"backing{i}")
        mnt = os.path.join(d, f"mnt{i}")
        (mount_ext4 if fs == "ext4" else mount_tmpfs)(backing, tmpfs_size)
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
