"""Any number of files under any descriptor limit (inode.c, DESCRIPTORS): a daemon whose hard
RLIMIT_NOFILE is 4,096 and cannot be raised (no CAP_SYS_RESOURCE) serves, walks, reads, evicts and removes
a cache of many more files, and the kernel's leftover inodes of evicted files hold no descriptor."""
import os
import subprocess
import time

import pytest

from conftest import ROOT, backing_bytes, wait_for

BUILD = os.environ.get("KCACHE_BUILD") or os.path.join(ROOT, "build")
KCACHE = os.environ.get("KCACHE_BIN") or os.path.join(BUILD, "kcache")
LIMIT = 4096


def start_limited(m, reopen="handle", limit=LIMIT):
    """Starts m's daemon with RLIMIT_NOFILE limit (4096) and no capability to raise it; reopen="name": nor
    CAP_DAC_READ_SEARCH, which open_by_handle_at needs (as for a daemon that is not root)."""
    caps = "-sys_resource" + (",-dac_read_search" if reopen == "name" else "")
    cmd = ["setpriv", "--bounding-set", caps, "sh", "-c",
           f'ulimit -Sn {limit} && ulimit -Hn {limit} && exec "$@"', "sh"] + m.args()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    m.stderr = p.stderr
    assert p.returncode == 0, f"kcachefs failed: {p.stderr}"
    wait_for(lambda: os.path.ismount(m.mnt), what="mount")
    pid = m.pid()
    for line in open(f"/proc/{pid}/limits"):
        if line.startswith("Max open files"):
            assert line.split()[3:5] == [str(limit), str(limit)], line
    return pid


def nfds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.parametrize("reopen", ["handle", "name"])
def test_a_daemon_limited_to_4096_descriptors_serves_walks_and_removes_many_more_files(kfs, reopen):
    n_dirs, per_dir = 16, 1000  # 16,000 files and 16 directories: four times the limit
    m = kfs({"max_size": "1G"}, start=False, tmpfs_size="1g")
    pid = start_limited(m, reopen)
    for d in range(n_dirs):
        os.mkdir(m.path(f"d{d}"))
        for i in range(per_dir):
            with open(m.path(f"d{d}", f"f{i}"), "wb") as f:
                f.write(b"%d/%d" % (d, i))
    worst = nfds(pid)
    # Walk (each walk makes the kernel look up and keep every inode), stat, read, list.
    found = subprocess.run(["find", m.mnt, "-type", "f"], capture_output=True, text=True, check=True).stdout.split()
    assert len(found) == n_dirs * per_dir
    subprocess.run(["du", "-s", m.mnt], capture_output=True, check=True)
    ls = subprocess.run(["ls", "-lR", m.mnt], capture_output=True, text=True)
    assert ls.returncode == 0, ls.stderr[-2000:]
    worst = max(worst, nfds(pid))
    for d in range(n_dirs):
        for i in range(0, per_dir, 7):
            assert open(m.path(f"d{d}", f"f{i}"), "rb").read() == b"%d/%d" % (d, i)
    worst = max(worst, nfds(pid))
    # Renamed through the mount, a directory and a file still reopen (by name: from where they went).
    os.rename(m.path("d0"), m.path("d0r"))
    os.rename(m.path("d1", "f3"), m.path("d0r", "f3moved"))
    subprocess.run(["find", m.mnt, "-type", "f"], capture_output=True, check=True)  # their fds are closed
    for i in range(0, per_dir, 11):
        os.stat(m.path("d0r", f"f{i}"))
        assert open(m.path("d0r", f"f{i}"), "rb").read() == b"0/%d" % i
    assert open(m.path("d0r", "f3moved"), "rb").read() == b"1/3"
    os.rename(m.path("d0r", "f3moved"), m.path("d1", "f3"))
    os.rename(m.path("d0r"), m.path("d0"))
    v = subprocess.run([KCACHE, "verify", m.mnt], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    # An operator's eviction of most of it, then rm -rf of the rest.
    subprocess.run([KCACHE, "evict", m.mnt, "--to", "16K"], capture_output=True, check=True)
    rm = subprocess.run(["rm", "-rf"] + [m.path(f"d{d}") for d in range(n_dirs)], capture_output=True, text=True)
    assert rm.returncode == 0, rm.stderr[-2000:]
    assert os.listdir(m.mnt) == []
    worst = max(worst, nfds(pid))
    assert worst < LIMIT * 3 // 4, f"the daemon held {worst} descriptors"
    assert int(os.getxattr(m.mnt, "user.kcachefs.files")) == 0
    assert int(os.getxattr(m.mnt, "user.kcachefs.used_bytes")) == 0
    # At the next mount the daemon says what the limit does to a cache of this size.
    m.stop()
    for d in range(n_dirs):  # put files back behind its back, and have the index rebuilt
        os.makedirs(os.path.join(m.backing, f"d{d}"))
        for i in range(per_dir):
            open(os.path.join(m.backing, f"d{d}", f"f{i}"), "wb").close()
    m.opts["rebuild"] = True
    start_limited(m, reopen)
    said = "keeping at most 2048 of the cache's 16000 files' descriptors open (RLIMIT_NOFILE 4096); the others " \
           f"are reopened by {'file handle' if reopen == 'handle' else 'name'}"
    assert said in m.stderr, m.stderr


@pytest.mark.parametrize("reopen", ["handle", "name"])
def test_evicted_files_the_kernel_remembers_hold_no_descriptor(kfs, reopen):
    m = kfs({"max_size": "4M"}, start=False, tmpfs_size="512m")
    pid = start_limited(m, reopen)
    payload = os.urandom(8192)
    worst = 0
    for i in range(3 * LIMIT):  # 12,288 files of 8 KiB through a 4 MiB cache: ~11,800 evictions
        with open(m.path(f"f{i}"), "wb") as f:
            f.write(payload)
        if i % 512 == 0:
            worst = max(worst, nfds(pid))
    evicted = int(os.getxattr(m.mnt, "user.kcachefs.evicted_files"))
    assert evicted > 2 * LIMIT
    assert worst < LIMIT // 2, f"the daemon held {worst} descriptors after {evicted} evictions"
    # The kernel still knows the evicted names' inodes: a stat of each old name says ENOENT.
    gone = sum(1 for i in range(0, 3 * LIMIT, 97) if not os.path.exists(m.path(f"f{i}")))
    assert gone > 0


def test_an_inode_whose_names_are_all_gone_answers_estale_never_eperm(kfs):
    """Without file handles, an inode whose remembered name went (a link removed) reopens its idle
    descriptor by the index's names. When none of them holds it any more (here renamed behind the
    daemon's back), the open must answer ESTALE, on which the kernel looks the name up again: the failed
    openat's -1 was returned as -errno, and the stress test's O_CREAT open got EPERM, one run in a dozen."""
    m = kfs({"max_size": "64M", "inode_fds": "2"}, fs="ext4", tmpfs_size="64m", start=False)
    start_limited(m, "name", 1024)
    d = m.path("d")
    os.mkdir(d)
    with open(os.path.join(d, "a"), "wb") as f:
        f.write(b"x" * 4096)
    os.link(os.path.join(d, "a"), os.path.join(d, "b"))
    os.stat(os.path.join(d, "a"))  # remembered by this name
    os.unlink(os.path.join(d, "a"))  # now it reopens by the index's names: b
    os.stat(os.path.join(d, "b"))  # the kernel holds b's entry (timeout) and inode
    for i in range(8):  # other inodes push its descriptor out of the idle set (inode_fds=2)
        with open(os.path.join(d, f"other{i}"), "wb") as f:
            f.write(b"o")
    os.rename(os.path.join(m.backing, "d", "b"), os.path.join(m.backing, "d", "c"))  # behind its back
    try:
        fd = os.open(os.path.join(d, "b"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(fd)  # looked up again after ESTALE: b is gone, so O_CREAT made a new one
        assert os.path.getsize(os.path.join(d, "b")) == 0
    except FileNotFoundError:
        pass  # the name's cached entry had expired: a plain new file, the same outcome
    assert not os.path.exists(os.path.join(d, "a"))


@pytest.mark.parametrize("reopen", ["handle", "name"])
def test_a_new_file_on_the_number_of_a_removed_directory_is_counted(kfs, reopen):
    """As for a removed file (below), for a removed directory: its inode lives on in the daemon while the
    kernel holds it, and ext4 gives its number to the next file made. The new file took the directory's
    struct (rmdir did not mark it, and nothing compared the type), so none of its writes was counted: a
    row of 0 bytes, which the stress test's by-name case met about one run in twenty."""
    m = kfs({"max_size": "64M", "inode_fds": "2"}, fs="ext4", tmpfs_size="64m", start=False)
    start_limited(m, reopen, 1024)
    d = m.path("d")
    os.mkdir(d)
    held = []
    try:
        reused = None
        for attempt in range(8):
            x = os.path.join(d, f"x{attempt}")
            os.mkdir(x)
            held.append(os.open(x, os.O_PATH))  # the kernel keeps the inode: no FORGET
            old = os.fstat(held[-1]).st_ino
            os.rmdir(x)
            for i in range(16):
                p = os.path.join(d, f"new{attempt}-{i}")
                with open(p, "wb") as f:
                    f.write(b"n" * 65536)
                if os.stat(p).st_ino == old:
                    reused = p
                    break
            if reused:
                break
        assert reused, "ext4 gave no removed directory's number to a new file"
        subprocess.run(["sync"], check=True)
        v = subprocess.run([KCACHE, "verify", m.mnt], capture_output=True, text=True)
        assert v.returncode == 0, v.stdout + v.stderr
        assert int(os.getxattr(m.mnt, "user.kcachefs.used_bytes")) == backing_bytes(m.backing)
    finally:
        for fd in held:
            os.close(fd)


@pytest.mark.parametrize("reopen", ["handle", "name"])
def test_a_new_file_on_the_number_of_a_removed_one_is_counted(kfs, reopen):
    """ext4 gives a removed file's inode number to the next file made. The removed file's inode lives on
    in the daemon while the kernel still holds it (here an O_PATH descriptor holds it), marked unlinked:
    no longer counted. A new file found under that number must get an inode of its own: when it took the
    old one, none of its writes was counted (a row of 0 bytes), about one stress run in five with
    inode_fds=48."""
    m = kfs({"max_size": "64M", "inode_fds": "2"}, fs="ext4", tmpfs_size="64m", start=False)
    start_limited(m, reopen, 1024)
    d = m.path("d")
    os.mkdir(d)
    with open(os.path.join(d, "a"), "wb") as f:
        f.write(b"x" * 4096)
    os.link(os.path.join(d, "a"), os.path.join(d, "b"))
    held = os.open(os.path.join(d, "a"), os.O_PATH)  # the kernel keeps the inode: no FORGET
    old = os.fstat(held).st_ino
    try:
        os.stat(os.path.join(d, "b"))  # the daemon remembers the file by this name
        os.unlink(os.path.join(d, "b"))
        for i in range(8):  # other inodes push its descriptor out of the idle set (inode_fds=2)
            with open(os.path.join(d, f"other{i}"), "wb") as f:
                f.write(b"o")
        os.unlink(os.path.join(d, "a"))  # its last name, not the one it remembered
        reused = None
        for i in range(64):
            p = os.path.join(d, f"new{i}")
            with open(p, "wb") as f:
                f.write(b"n" * 65536)
            if os.stat(p).st_ino == old:
                reused = p
                break
        # Without file handles the removed file's inode keeps a descriptor for its last name: its number
        # is not free while the kernel knows it (reused stays None). With them, it is, and goes to new0.
        assert reused or reopen == "name", "ext4 gave the removed file's number to no new file"
        subprocess.run(["sync"], check=True)
        v = subprocess.run([KCACHE, "verify", m.mnt], capture_output=True, text=True)
        assert v.returncode == 0, v.stdout + v.stderr
        assert int(os.getxattr(m.mnt, "user.kcachefs.used_bytes")) == backing_bytes(m.backing)
    finally:
        os.close(held)


def test_a_descriptor_limit_lowered_while_it_runs_sheds_idle_descriptors(kfs):
    """prlimit lowers a running daemon's RLIMIT_NOFILE below the descriptors it holds (idle inodes' fds
    after a walk): the next opens find none free (EMFILE), and the daemon closes idle ones and tries again,
    instead of failing the caller's create, open or lookup."""
    n = 6000
    m = kfs({"max_size": "1G"}, tmpfs_size="512m")
    pid = m.pid()
    os.mkdir(m.path("d"))
    for i in range(n):
        with open(m.path("d", f"f{i}"), "wb") as f:
            f.write(b"%d" % i)
    subprocess.run(["find", m.mnt, "-type", "f"], capture_output=True, check=True)  # every inode looked up
    held = nfds(pid)
    assert held > 5000, f"the daemon holds only {held} descriptors: the test would not test"
    subprocess.run(["prlimit", f"--pid={pid}", "--nofile=4096:4096"], check=True)
    for i in range(200):  # creates, new lookups and opens, each needing a descriptor
        with open(m.path("d", f"new{i}"), "wb") as f:
            f.write(b"new%d" % i)
    for i in range(0, n, 13):
        with open(m.path("d", f"f{i}"), "rb") as f:
            assert f.read() == b"%d" % i
    assert nfds(pid) < 4096
    v = subprocess.run([KCACHE, "verify", m.mnt], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
