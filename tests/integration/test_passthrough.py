"""Kernel passthrough for read-only opens (fs/passthrough.c), through a real mount: negotiated when the
daemon runs as root on a kernel that offers it, reads served by the kernel from the backing file, the
kernel's one-I/O-mode-per-inode rule kept between readers and writers of one file, and space, eviction
and atime as exact as in the page-cache mode."""
import errno
import fcntl
import mmap
import os
import subprocess

import pytest

from conftest import ensure_user, kcachefs_bin, private_dir, wait_for

PT = {"nopassthrough": False}  # passthrough on, whatever KCACHEFS_MOUNT_OPTS says


def state(m):
    return os.getxattr(m.mnt, "user.kcachefs.passthrough").decode()


def pt_opens(m):
    return int(os.getxattr(m.mnt, "user.kcachefs.passthrough_opens"))


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def settle(m, path):
    """Waits until a read-only open of path gets passthrough. The writer's RELEASE reaches the daemon
    after close() returns; until then the file still counts as open in the page-cache mode, and a reader
    gets that mode too (the kernel's rule, fs/passthrough.c)."""
    def opened_in_passthrough():
        before = pt_opens(m)
        with open(path, "rb"):
            pass
        return pt_opens(m) > before
    wait_for(opened_in_passthrough, what=f"a passthrough open of {path}")


@pytest.fixture
def ptmount(kfs):
    def make(opts=None, **kw):
        m = kfs({**PT, **(opts or {})}, **kw)
        s = state(m)
        if "does not offer" in s:
            pytest.skip(f"this kernel has no FUSE passthrough ({s})")
        assert s == "on", s
        return m
    return make


def test_reads_bypass_the_daemon_and_atime_stays_exact(ptmount, kfs):
    data = os.urandom(1 << 20)
    for m, passthrough in ((ptmount(), True), (kfs({"nopassthrough": True}), False)):
        write(m.path("k.bin"), data)
        if passthrough:
            settle(m, m.path("k.bin"))
        before = os.stat(m.path("k.bin")).st_atime_ns
        opens = pt_opens(m)
        drop_caches()  # nothing cached: the page-cache mode must ask the daemon for every byte
        with open(m.path("k.bin"), "rb") as f:
            assert f.read() == data
        served = int(os.getxattr(m.path("k.bin"), "user.kcachefs.bytes_read"))
        if passthrough:
            assert pt_opens(m) == opens + 1
            assert served == 0, "the kernel read the backing file itself"
        else:
            assert state(m) == "off: -o nopassthrough" and pt_opens(m) == 0
            assert served == len(data)
        logged = int(os.getxattr(m.path("k.bin"), "user.kcachefs.atime_ns"))
        assert logged > before
        # stat shows it once the daemon has had the RELEASE that close() queued (fs/ops-io.c, ATIME)
        wait_for(lambda: os.stat(m.path("k.bin")).st_atime_ns == logged, timeout=5, what="the logged atime")
        # an open without a read (a mapping, a size check) is an access too
        fd = os.open(m.path("k.bin"), os.O_RDONLY)
        os.close(fd)
        again = int(os.getxattr(m.path("k.bin"), "user.kcachefs.atime_ns"))
        assert again > logged
        wait_for(lambda: os.stat(m.path("k.bin")).st_atime_ns == again, timeout=5, what="the new atime")


def test_a_writer_joins_passthrough_readers_and_the_limit_holds(ptmount):
    m = ptmount({"max_size": "4M", "grace_ms": 0}, tmpfs_size="64m")
    write(m.path("f"), b"a" * (1 << 20))
    settle(m, m.path("f"))
    with open(m.path("f"), "rb") as r:
        assert r.read(4) == b"aaaa"
        opens = pt_opens(m)
        # The inode is in passthrough mode: a page-cache open would fail with EIO in the kernel.
        with open(m.path("f"), "r+b") as w:
            assert pt_opens(m) == opens + 1
            w.write(b"XYZ")
            w.flush()
            assert os.pread(r.fileno(), 3, 0) == b"XYZ"  # the reader reads the backing file
            mm = mmap.mmap(w.fileno(), 4096)  # shared mappings map the backing file
            mm[8:11] = b"MAP"
            mm.flush()
            mm.close()
            assert os.pread(r.fileno(), 3, 8) == b"MAP"
            # Its writes still come to the daemon, which enforces the limit: nothing else to evict.
            with pytest.raises(OSError) as e:
                w.seek(0, os.SEEK_END)
                w.write(b"b" * (8 << 20))
                w.flush()
            assert e.value.errno == errno.ENOSPC
        m.assert_within(4 << 20)
    with open(m.path("f"), "rb") as f:
        head = f.read(11)
    assert head == b"XYZaaaaaMAP"


def test_a_reader_joins_a_page_cache_writer(ptmount):
    m = ptmount()
    opens = pt_opens(m)
    with open(m.path("g"), "wb") as w:  # a new file: the page-cache mode
        w.write(b"first")
        w.flush()
        with open(m.path("g"), "rb") as r:  # a passthrough open would fail with EIO now
            assert r.read() == b"first"
            w.write(b"-second")
            w.flush()
            assert os.pread(r.fileno(), 100, 0) == b"first-second"
    assert pt_opens(m) == opens
    settle(m, m.path("g"))  # nobody has it open now: passthrough
    with open(m.path("g"), "rb") as r:
        assert r.read() == b"first-second"


def backing_free(m):
    s = os.statvfs(m.backing)
    return s.f_bfree * s.f_frsize


@pytest.mark.parametrize("how", ["evict", "unlink"])
def test_a_file_read_through_passthrough_frees_its_blocks_when_it_goes(ptmount, how):
    # The registered backing file holds the file open in the kernel: eviction and forgetting the inode
    # must unregister it, or tmpfs keeps the blocks.
    m = ptmount({"grace_ms": 0}, tmpfs_size="128m")
    size = 32 << 20
    write(m.path("big"), b"z" * size)
    settle(m, m.path("big"))
    with open(m.path("big"), "rb") as f:
        assert len(f.read()) == size
    assert pt_opens(m) >= 1
    free = backing_free(m)
    if how == "evict":
        os.setxattr(m.path("big"), "user.kcachefs.evict", b"1")
    else:
        os.unlink(m.path("big"))
    wait_for(lambda: backing_free(m) >= free + size - (1 << 20), timeout=10,
             what=f"the blocks of the {how}ed file to be freed")
    assert m.used() < 1 << 20


def test_an_unprivileged_daemon_runs_without_passthrough(kfs, workdir):
    u = ensure_user("kcpt")
    d, cleanup = workdir
    backing, mnt = os.path.join(private_dir(d, u), "ub"), os.path.join(d, "um")
    for p in (backing, mnt):
        os.makedirs(p)
        os.chown(p, u.pw_uid, u.pw_gid)
    os.chmod(d, 0o755)
    cleanup.insert(0, mnt)
    # Debian makes /dev/fuse 0666; a container may not: open it to users for this test.
    mode = os.stat("/dev/fuse").st_mode & 0o777
    os.chmod("/dev/fuse", 0o666)
    try:
        p = subprocess.run(["runuser", "-u", u.pw_name, "--", kcachefs_bin(), "-o", "max_size=64M",
                            backing, mnt], capture_output=True, text=True, timeout=60)
    finally:
        os.chmod("/dev/fuse", mode)
    if p.returncode != 0 and "fusermount" in p.stderr:
        pytest.skip(f"an unprivileged user cannot mount FUSE here: {p.stderr.strip()}")
    assert p.returncode == 0, p.stderr
    def mounted():  # root may not look into another user's FUSE mount without allow_other
        with open("/proc/self/mounts") as f:
            return any(line.split()[1] == mnt for line in f)
    try:
        wait_for(mounted, what="mount")
        assert "not root" in p.stderr
        s = subprocess.run(["runuser", "-u", u.pw_name, "--", "sh", "-c",
                            f"echo hello > {mnt}/f && cat {mnt}/f && getfattr --only-values -n user.kcachefs.passthrough {mnt}"],
                           capture_output=True, text=True, timeout=60)
        assert s.returncode == 0, s.stderr
        out = s.stdout.splitlines()
        assert out[0] == "hello"
        assert out[1].startswith("off: the daemon is not root")
    finally:
        subprocess.run(["runuser", "-u", u.pw_name, "--", "fusermount3", "-u", mnt], capture_output=True)
        wait_for(lambda: not mounted(), what="unmount")


def test_a_passthrough_reader_opens_its_own_fd_only_when_asked(ptmount):
    # A passthrough reader has no backing fd in the daemon until an operation needs one; then it gets its
    # own open file description, so flock() between two readers still conflicts as on a local disk.
    m = ptmount()
    with open(m.path("s"), "wb") as f:
        f.truncate(1 << 20)
        f.seek(512 << 10)
        f.write(b"d" * 4096)
    settle(m, m.path("s"))
    opens = pt_opens(m)
    a = os.open(m.path("s"), os.O_RDONLY)
    b = os.open(m.path("s"), os.O_RDONLY)
    try:
        assert os.read(a, 4) == b"\0\0\0\0"
        fcntl.flock(a, fcntl.LOCK_EX)
        with pytest.raises(BlockingIOError):
            fcntl.flock(b, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(a, fcntl.LOCK_UN)
        fcntl.flock(b, fcntl.LOCK_SH | fcntl.LOCK_NB)
        assert os.lseek(b, 0, os.SEEK_DATA) == 512 << 10  # the daemon's fd answers SEEK_DATA
        assert os.lseek(b, 512 << 10, os.SEEK_HOLE) == (512 << 10) + 4096
        os.fsync(a)
        os.fchmod(a, 0o640)
        assert os.stat(m.path("s")).st_mode & 0o777 == 0o640
        assert os.fstat(b).st_size == 1 << 20
        assert pt_opens(m) == opens + 2
    finally:
        os.close(a)
        os.close(b)
