"""A hit's hot path (issue #24), counted from the daemon's own request counters (user.kcachefs.requests,
what the kernel sent, by opcode), so that a regression fails here rather than in a benchmark:

- a runtime's hit of a warm file whose attributes the kernel holds (open, fstat, read to the end, close;
  and NEO's variant with lseek(SEEK_END)) costs the kernel one synchronous request, OPEN. RELEASE follows
  close() in the background and is counted apart; no FLUSH (the daemon opens with FOPEN_NOFLUSH), no
  GETATTR (the access reaches the kernel's attributes at RELEASE, not at OPEN), no READ (passthrough, or
  the kernel's page cache kept for an unchanged file);
- so does a hit right after a hit, with nothing in between: a root daemon's child refreshes the
  attributes after each release (fs/refresh.c), whose GETATTR is counted as OWN and waited for by nobody;
- after the opener closed the file, stat shows the logged last access (fs/ops-io.c, ATIME)."""
import contextlib
import ctypes
import os
import re
import struct
import select
import shutil
import signal
import subprocess
import time

import pytest

from conftest import pid_alive, proc_state, wait_for

# The kernel waits for none of these; OWN: the daemon's own child's (fs/refresh.c), which no caller waits for
SYNC_FREE = {"RELEASE", "FORGET", "BATCH_FORGET", "INTERRUPT", "OWN"}
AT_EMPTY_PATH, AT_SYMLINK_NOFOLLOW, AT_STATX_DONT_SYNC = 0x1000, 0x100, 0x4000
STATX_ATIME = 0x20
AGAIN_S = 0.11  # fs/refresh.c refreshes a file at most once in 100 ms (AGAIN_NS)


def cached_atime_ns(path):
    """The atime the kernel holds for path, without asking the daemon (statx AT_STATX_DONT_SYNC)."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)
    if libc.statx(-100, os.fsencode(path), AT_SYMLINK_NOFOLLOW | AT_STATX_DONT_SYNC, STATX_ATIME, buf) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
    sec, nsec = struct.unpack_from("=qI", buf.raw, 64)  # struct statx: stx_atime
    return sec * 1000000000 + nsec


def counter(m, name):
    return int(os.getxattr(m.mnt, f"user.kcachefs.{name}"))


def refreshes(m):
    return counter(m, "refreshed"), counter(m, "refresh_dropped")


def requests(m):
    words = os.getxattr(m.mnt, "user.kcachefs.requests").decode().split()
    return {words[i]: int(words[i + 1]) for i in range(0, len(words), 2)}


def delta(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


def waited_for(d):
    """The requests of a delta (delta()) that someone waited for: neither SYNC_FREE's nor GETXATTR, our own
    reading of the counters."""
    return {k: v for k, v in d.items() if k not in SYNC_FREE | {"GETXATTR"}}


def runtime_hit(path, neo):
    fd = os.open(path, os.O_RDONLY)
    try:
        if neo:  # NEO: the size from lseek, then back to the start
            size = os.lseek(fd, 0, os.SEEK_END)
            os.lseek(fd, 0, os.SEEK_SET)
        else:
            size = os.fstat(fd).st_size
        got = b""
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            got += b
        assert len(got) == size
        return got
    finally:
        os.close(fd)


def every_open_released(m):
    """Whether the daemon has received a RELEASE for every OPEN and CREATE (RELEASE comes after close())."""
    r = requests(m)
    return r.get("RELEASE", 0) >= r.get("OPEN", 0) + r.get("CREATE", 0)


def settled(m, path):
    """Waits until every open of path has been released (RELEASE arrives after close()), and the kernel
    holds path's attributes again: a stat that asks nothing."""
    wait_for(lambda: every_open_released(m), what="every RELEASE")

    def quiet_stat():
        before = requests(m)
        os.stat(path)
        return "GETATTR" not in delta(before, requests(m))
    for _ in range(2):  # twice: a RELEASE counted is one received, its handler may still be running
        wait_for(quiet_stat, what="a stat answered from the kernel's attributes")


@pytest.mark.parametrize("mode", ["passthrough", "page cache"])
@pytest.mark.parametrize("neo", [False, True], ids=["fstat", "lseek"])
def test_a_warm_hit_costs_one_synchronous_request(kfs, mode, neo):
    m = kfs({"nopassthrough": mode == "page cache"})
    assert "user.kcachefs.requests" in os.listxattr(m.mnt)
    pt = os.getxattr(m.mnt, "user.kcachefs.passthrough").decode()
    if mode == "passthrough" and pt != "on":
        pytest.skip(f"no passthrough here: {pt}")
    data = os.urandom(256 << 10)
    path = m.path("k.bin")
    with open(path, "wb") as f:
        f.write(data)
    for _ in range(3):  # warm: the writer's handle released, passthrough or the page cache in place
        settled(m, path)
        assert runtime_hit(path, neo) == data
    settled(m, path)
    before = requests(m)
    assert runtime_hit(path, neo) == data
    wait_for(lambda: requests(m).get("RELEASE", 0) > before.get("RELEASE", 0), what="the hit's RELEASE")
    d = delta(before, requests(m))
    assert waited_for(d) == {"OPEN": 1}, f"a warm hit sent {d}"
    assert d.get("RELEASE") == 1


@pytest.mark.parametrize("mode", ["passthrough", "page cache"])
@pytest.mark.parametrize("after", ["dropped", "refreshed"])
def test_after_close_stat_shows_the_logged_atime(kfs, mode, after):
    """Dropped (-o norefresh, or a daemon that is not root): the next stat asks, and gets the logged atime.
    Refreshed: the kernel holds the logged atime before anyone asks (read without asking: statx
    AT_STATX_DONT_SYNC), and a stat then sends nothing."""
    if after == "refreshed" and os.geteuid() != 0:
        pytest.skip("only a root daemon refreshes (fs/refresh.c)")
    m = kfs({"nopassthrough": mode == "page cache", "norefresh": after == "dropped"})
    path = m.path("k.bin")
    with open(path, "wb") as f:
        f.write(b"k" * 8192)
    for read in (True, False, True):
        settled(m, path)
        time.sleep(AGAIN_S)  # a refresh at each close
        shown = os.stat(path).st_atime_ns  # the kernel holds the attributes now
        fd = os.open(path, os.O_RDONLY)
        if read:
            assert os.read(fd, 1 << 20) == b"k" * 8192
        logged = int(os.getxattr(path, "user.kcachefs.atime_ns"))
        assert logged > shown
        os.close(fd)
        # At the latest once the daemon has had the RELEASE that close() queued (kcachefs(8), ATIME);
        # without it the kernel would trust the attributes for an hour (-o timeout).
        if after == "refreshed":
            wait_for(lambda: cached_atime_ns(path) == logged, timeout=5, what="the logged atime in the kernel")
            before = requests(m)
            assert os.stat(path).st_atime_ns == logged
            assert "GETATTR" not in delta(before, requests(m)), "the refreshed attributes were not valid"
        wait_for(lambda: os.stat(path).st_atime_ns == logged, timeout=5, what="the logged atime in stat")
        assert int(os.getxattr(path, "user.kcachefs.atime_ns")) == logged


def hit_and_wait(m, path, neo, data):
    """A hit, and its release and refresh done: the kernel holds the file's attributes again."""
    time.sleep(AGAIN_S)
    done = sum(refreshes(m))
    assert runtime_hit(path, neo) == data
    wait_for(lambda: sum(refreshes(m)) > done, what="the refresh after the hit")


@pytest.mark.parametrize("mode", ["passthrough", "page cache"])
@pytest.mark.parametrize("neo", [False, True], ids=["fstat", "lseek"])
@pytest.mark.parametrize("made", ["written", "renamed"])
def test_a_hit_right_after_a_hit_costs_only_open(kfs, mode, neo, made):
    """Issue #24's count: a runtime that hits the same file again, nothing in between, sends OPEN alone
    (and RELEASE after it). Before fs/refresh.c the second hit's fstat waited for a GETATTR: the first hit's
    RELEASE dropped the attributes, and a read through passthrough drops atime by itself. Published both
    ways a runtime does: written in place, or written to a temporary name and renamed (the name the kernel
    knows it by then is the new one, fs/inode.c kdir and kname)."""
    if os.geteuid() != 0:
        pytest.skip("only a root daemon refreshes (fs/refresh.c)")
    m = kfs({"nopassthrough": mode == "page cache"})
    pt = os.getxattr(m.mnt, "user.kcachefs.passthrough").decode()
    if mode == "passthrough" and pt != "on":
        pytest.skip(f"no passthrough here: {pt}")
    os.mkdir(m.path("d"))
    data = os.urandom(256 << 10)
    path = m.path("d/k.bin")
    with open(path + ".tmp" if made == "renamed" else path, "wb") as f:
        f.write(data)
    if made == "renamed":
        os.rename(path + ".tmp", path)
    assert runtime_hit(path, neo) == data  # the first reader's open: page cache or passthrough chosen
    wait_for(lambda: sum(refreshes(m)) >= 1, what="the first refresh")
    for _ in range(3):
        hit_and_wait(m, path, neo, data)
    ok, dropped = refreshes(m)
    before = requests(m)
    hit_and_wait(m, path, neo, data)
    d = delta(before, requests(m))
    assert waited_for(d) == {"OPEN": 1}, f"a hit right after a hit sent {d}"
    assert d.get("RELEASE") == 1 and d.get("OWN") == 1, d
    assert refreshes(m) == (ok + 1, dropped), "the child could not refresh the file"


def walk(top):
    """A walk as find, du and glibc's opendir make it: each directory opened and fstat'ed, then listed."""
    names = 0
    todo = [top]
    while todo:
        d = todo.pop()
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fstat(fd)
            with os.scandir(fd) as it:
                for e in it:
                    names += 1
                    if e.is_dir(follow_symlinks=False):
                        todo.append(os.path.join(d, e.name))
        finally:
            os.close(fd)
    return names


def test_a_walk_after_a_listing_was_read_asks_nothing(kfs):
    """The kernel drops a directory's atime after each READDIR it sends, so the walk after a walk whose
    listings came from the daemon (the first, or the first after the kernel let them go) made each
    directory's fstat wait for a GETATTR: 13 here. The end of each listing queues the directory for the
    child (fs/refresh.c, DIRECTORIES), and the second walk's fstats ask nothing, nor do its listings. The
    child's GETATTR comes 20 ms after a listing ended; a lister kept off the CPU longer than that before
    the kernel drops the atime (a loaded machine) makes that refresh too early, so a try may see a GETATTR
    or two, and a fresh tree is tried up to three times: without the refresh every try sees 13."""
    if os.geteuid() != 0:
        pytest.skip("only a root daemon refreshes (fs/refresh.c)")
    m = kfs({})
    sent = []
    for attempt in range(3):
        top = m.path(f"t{attempt}")
        for i in range(6):
            os.makedirs(os.path.join(top, f"d{i}/sub"))
            for j in range(3):
                with open(os.path.join(top, f"d{i}/sub/f{j}"), "wb") as f:
                    f.write(b"x")
        time.sleep(AGAIN_S)
        ok, dropped = refreshes(m)
        before = requests(m)
        assert walk(top) == 6 * 5
        d = delta(before, requests(m))
        listed = d.get("READDIRPLUS", 0) + d.get("READDIR", 0)
        assert listed >= 13, "the first walk's listings did not come from the daemon"
        wait_for(lambda: refreshes(m)[0] >= ok + 13, what="the 13 directories refreshed")
        assert refreshes(m)[1] == dropped
        before = requests(m)
        assert walk(top) == 6 * 5
        d = delta(before, requests(m))
        assert not d.get("READDIRPLUS") and not d.get("READDIR"), f"the listings were not kept: {d}"
        if d.get("GETATTR", 0) <= 2:
            return
        sent.append(d)
    pytest.fail(f"the second walk's fstats asked in every try: {sent}")


def test_the_child_follows_renames_and_drops_what_it_cannot_name(kfs):
    """The child resolves the names the kernel knows a file and its directories by (fs/inode.c: kdir,
    kname), from the kernel's dentry cache only (common/tree.h, ktree_open_cached: no LOOKUP, no symlink,
    no other mount; its refusals are test-tree's), and checks the inode number it reaches. A directory
    renamed through the mount takes its files' paths with it: they are still refreshed. A file whose name
    went (a second link made and removed, the file opened by its cached first name) cannot be named: it
    is dropped, and stat shows the logged atime all the same."""
    if os.geteuid() != 0:
        pytest.skip("only a root daemon refreshes (fs/refresh.c)")
    m = kfs({})
    os.makedirs(m.path("a/x"))
    with open(m.path("a/x/f"), "wb") as f:
        f.write(b"f" * 4096)

    def hit(path):
        time.sleep(AGAIN_S)
        ok, dropped = refreshes(m)
        with open(path, "rb") as f:
            assert f.read() == b"f" * 4096
        logged = int(os.getxattr(path, "user.kcachefs.atime_ns"))
        wait_for(lambda: refreshes(m) != (ok, dropped), what="the refresh or the drop")
        assert os.stat(path).st_atime_ns == logged
        got = refreshes(m)
        return got[0] - ok, got[1] - dropped

    assert hit(m.path("a/x/f")) == (1, 0)
    os.rename(m.path("a"), m.path("b"))  # the kernel moves the dentries: it looks nothing up again
    assert hit(m.path("b/x/f")) == (1, 0), "a renamed directory's file was not refreshed"
    os.link(m.path("b/x/f"), m.path("b/x/g"))  # the name the kernel knows it by is g now
    os.unlink(m.path("b/x/g"))  # and it went; f's dentry is cached: opening it looks nothing up
    assert hit(m.path("b/x/f")) == (0, 1), "a file without a known name was not dropped"
    os.stat(m.path("b/x/f"))  # still no LOOKUP: the kernel holds the dentry
    assert hit(m.path("b/x/f")) == (0, 1)


def refreshed_file(kfs):
    """A root daemon's mount with one file, hit once and refreshed: the kernel holds its attributes."""
    if os.geteuid() != 0:
        pytest.skip("only a root daemon refreshes (fs/refresh.c)")
    m = kfs({})
    path = m.path("k.bin")
    data = b"k" * 8192
    with open(path, "wb") as f:
        f.write(data)
    hit_and_wait(m, path, False, data)
    return m, path, data


def test_a_refresh_left_to_the_last_opener_is_owed_whatever_the_first_release_found(kfs):
    """fs/refresh.c, COST: a release while the file is open elsewhere leaves the refresh owed to the last
    opener's release, even when it came within AGAIN_NS of the last refresh (which alone would have queued
    nothing). The last release finds the attributes dropped by the first; without the debt it queued
    nothing, and the next hit's fstat waited for a GETATTR."""
    m, path, data = refreshed_file(kfs)  # refreshed a moment ago: AGAIN_NS runs from here
    ok, dropped = refreshes(m)
    a, b = os.open(path, os.O_RDONLY), os.open(path, os.O_RDONLY)
    try:
        assert os.fstat(a).st_size == os.fstat(b).st_size == len(data)  # from the refreshed attributes
        assert os.read(a, len(data)) == data and os.read(b, len(data)) == data
        released = requests(m).get("RELEASE", 0)
        os.close(a)
        a = None
        wait_for(lambda: requests(m).get("RELEASE", 0) > released, what="the first RELEASE")
        time.sleep(AGAIN_S)  # the last release comes past AGAIN_NS
    finally:
        for fd in (a, b):
            if fd is not None:
                os.close(fd)
    wait_for(lambda: refreshes(m) == (ok + 1, dropped), what="the refresh owed to the last opener")
    before = requests(m)
    assert runtime_hit(path, False) == data
    wait_for(lambda: every_open_released(m), what="the hit's RELEASE")
    d = delta(before, requests(m))
    assert waited_for(d) == {"OPEN": 1}, d


@pytest.mark.parametrize("mode", ["passthrough", "page cache"])
def test_a_file_nobody_asks_the_attributes_of_is_not_refreshed(kfs, mode):
    """fs/refresh.c, COST: a release that finds the kernel holding none of the daemon's attributes (dropped
    before the open, and nobody asked since) queues no refresh: nobody took them, so nobody is owed new
    ones. Readers that only open, read and close (8 of them on one tree made 3,600 to 6,500 refreshes a
    pass for nobody) leave the file dropped. The first opener that asks again waits for one GETATTR, and
    its release refreshes the file as before: the hit after it sends OPEN alone."""
    if os.geteuid() != 0:
        pytest.skip("only a root daemon refreshes (fs/refresh.c)")
    m = kfs({"nopassthrough": mode == "page cache"})
    path = m.path("k.bin")
    data = os.urandom(64 << 10)
    with open(path, "wb") as f:
        f.write(data)  # a writer's release drops the attributes and refreshes nothing
    wait_for(lambda: every_open_released(m), what="the writer's RELEASE")
    ok, dropped = refreshes(m)
    before = requests(m)
    for _ in range(3):  # no stat; reads up to the size, not past it (a page-cache read past it asks)
        time.sleep(AGAIN_S)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert os.read(fd, len(data)) == data
        finally:
            os.close(fd)
        wait_for(lambda: every_open_released(m), what="the reader's RELEASE")
        time.sleep(0.1)  # a refresh queued would be sent within a millisecond's batch
    d = delta(before, requests(m))
    assert "GETATTR" not in d, f"the reads asked for the attributes: {d}"
    assert refreshes(m) == (ok, dropped), "a file nobody asked the attributes of was refreshed"
    before = requests(m)
    hit_and_wait(m, path, False, data)  # its fstat asks, once
    assert refreshes(m) == (ok + 1, dropped)
    assert delta(before, requests(m)).get("GETATTR") == 1
    time.sleep(AGAIN_S)
    before = requests(m)
    assert runtime_hit(path, False) == data
    wait_for(lambda: every_open_released(m), what="the hit's RELEASE")
    d = delta(before, requests(m))
    assert waited_for(d) == {"OPEN": 1}, d


def test_the_last_of_overlapping_openers_refreshes(kfs):
    """A release while the file is still open elsewhere leaves the refresh to the last opener's release
    (fs/refresh.c, COST): two descriptors open at once, closed one after the other, make one refresh; and
    the file is refreshed again at its next hits (a release that left it to another once must not leave
    it unrefreshed for good)."""
    m, path, data = refreshed_file(kfs)
    time.sleep(AGAIN_S)
    ok, dropped = refreshes(m)
    a, b = os.open(path, os.O_RDONLY), os.open(path, os.O_RDONLY)
    assert os.read(a, 1 << 20) == data and os.read(b, 1 << 20) == data
    released = requests(m).get("RELEASE", 0)
    os.close(a)
    wait_for(lambda: requests(m).get("RELEASE", 0) > released, what="the first RELEASE")
    time.sleep(0.1)  # a refresh queued would be sent within a millisecond's batch
    assert refreshes(m) == (ok, dropped), "a file still open elsewhere was refreshed"
    os.close(b)
    wait_for(lambda: refreshes(m) == (ok + 1, dropped), what="the last opener's refresh")
    for _ in range(2):
        hit_and_wait(m, path, False, data)
    assert refreshes(m) == (ok + 3, dropped)
    before = requests(m)
    hit_and_wait(m, path, False, data)
    d = delta(before, requests(m))
    assert waited_for(d) == {"OPEN": 1}, d


def refresh_child(m):
    """The pid of the mount's refresher (fs/refresh.c): a child of the daemon, or None."""
    daemon = m.pid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == daemon and b"--refresh-child" in argv:
            return int(pid)
    return None


def test_the_refresher_killed_comes_back_and_goes_at_unmount(kfs):
    """Killing the child costs nothing but drops: the files it held are dropped (stat shows the logged
    atime all the same), a new child starts a few seconds later, and at unmount the child and the daemon
    both end (the child's clone of the mount must not keep the daemon serving)."""
    if os.geteuid() != 0:
        pytest.skip("only a root daemon refreshes (fs/refresh.c)")
    m = kfs({})
    path = m.path("k.bin")
    with open(path, "wb") as f:
        f.write(b"k" * 4096)
    hit_and_wait(m, path, False, b"k" * 4096)
    child = refresh_child(m)
    assert child, "no refresher after a hit"
    os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(AGAIN_S)
        ok, dropped = refreshes(m)
        runtime_hit(path, False)
        logged = int(os.getxattr(path, "user.kcachefs.atime_ns"))
        wait_for(lambda: refreshes(m) != (ok, dropped), what="the refresh or the drop")
        assert os.stat(path).st_atime_ns == logged
        if refreshes(m)[0] > ok:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"no refresh for 30 s after the child was killed: {refreshes(m)}")
    assert refreshes(m)[1] >= 1, "the killed child's file was not dropped"
    new = refresh_child(m)
    assert new and new != child
    daemon = m.pid()
    m.stop()  # fusermount3 -u, then waits for the daemon's exit
    wait_for(lambda: not pid_alive(new), what="the child's exit")
    assert not pid_alive(daemon)



def test_a_stalled_refresher_holds_a_bounded_queue(kfs):
    """While the child does not answer (stopped here; ANSWER_MS, 10 s, before the thread gives up on it),
    releases go on queueing their files' paths. A user who makes deep paths must not make the daemon hold
    more than QUEUE_BYTES_MAX (16 MiB) of them: past it, releases only drop (fs/refresh.c, COST). 6,000
    files of paths of about 3,700 bytes are 22 MiB; with the cap, about 1,500 of them are dropped at once,
    while the child is still stopped. Once it goes on, the queue empties and a release is refreshed again
    (the cap counts what left the queue too)."""
    if os.geteuid() != 0:
        pytest.skip("only a root daemon refreshes (fs/refresh.c)")
    m = kfs({})
    deep = os.path.join(*(c * 250 for c in "abcdefghijklmn"))  # 14 x 251 bytes
    os.makedirs(m.path(deep))
    names = [os.path.join(m.path(deep), f"{i:06d}" + "f" * 190) for i in range(6003)]
    names, fresh = names[:6000], names[6000:]  # released after, as deep as the others
    for n in names + fresh:
        with open(n, "wb"):
            pass
    with open(names[0], "rb"):
        pass
    child = wait_for(lambda: refresh_child(m), what="the refresher's child")
    time.sleep(0.2)
    os.kill(child, signal.SIGSTOP)
    try:
        ok, dropped = refreshes(m)
        for n in names[1:]:
            with open(n, "rb"):
                pass
        wait_for(lambda: every_open_released(m), what="every RELEASE")
        got = refreshes(m)[1] - dropped
        state = proc_state(child)
        assert state == "T", f"the child is no longer the stopped one ({state}): the thread gave up on it"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGCONT)
    assert got >= 1000, f"only {got} of 5,999 releases dropped with the child stopped: the queue is not bounded"
    wait_for(lambda: sum(refreshes(m)) >= ok + dropped + 5999, timeout=60, what="the queue emptied")
    before = refreshes(m)
    for n in fresh:
        with open(n, "rb"):
            pass
    wait_for(lambda: sum(refreshes(m)) >= sum(before) + 3, what="the fresh files' refreshes or drops")
    assert refreshes(m)[0] == before[0] + 3, "the fresh files were not refreshed once the queue emptied"


def test_a_warm_open_reads_nothing_from_the_index(kfs):
    # An OPEN of a file that did not change tells the index nothing: the inode knows the bytes its row
    # holds (fs/inode.c, T3). Before, every OPEN asked the index for the row's old size (kidx_set_bytes ->
    # size_of_row): an SQLite read transaction on the WAL, fcntl() locks on its -shm file, under the one
    # read connection's mutex. Counted with strace on the daemon (flush_ms=60000: no commit meanwhile).
    strace = shutil.which("strace")
    if not strace:
        pytest.skip("strace is not installed (scripts/install-deps installs it)")
    m = kfs({"flush_ms": "60000"})
    paths = [m.path(f"k{i}.bin") for i in range(20)]
    for p in paths:
        with open(p, "wb") as f:
            f.write(os.urandom(64 << 10))
    os.setxattr(m.mnt, "user.kcachefs.flush", b"1")  # the rows committed: only the database has them now
    for p in paths:
        settled(m, p)
        runtime_hit(p, False)
    pid = m.pid()
    # The index's own descriptors: the database, its WAL and -shm. A READ that the kernel sends again
    # once it dropped the file's pages (memory pressure) is a pread64 of the backing file, not the index.
    fds = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    ifds = {fd for fd, t in fds.items() if re.search(r"index\.db(-wal|-shm)?$", t)}
    assert ifds, f"no index descriptor among the daemon's: {sorted(fds.values())}"
    out = os.path.join(os.path.dirname(m.backing), "strace.out")
    tracer = subprocess.Popen([strace, "-f", "-e", "trace=fcntl,pread64,fstat,newfstatat", "-o", out, "-p", str(pid)],
                              stderr=subprocess.PIPE, text=True)
    try:
        said, end = "", time.monotonic() + 10
        while "attached" not in said and time.monotonic() < end:  # "Process N attached with M threads"
            if select.select([tracer.stderr], [], [], 0.1)[0]:
                said = tracer.stderr.readline()
        assert "attached" in said, f"strace did not attach: {said!r}"
        for _ in range(5):
            for p in paths:
                runtime_hit(p, False)
        wait_for(lambda: requests(m).get("RELEASE", 0) >= requests(m).get("OPEN", 0), what="every RELEASE")
    finally:
        tracer.terminate()
        tracer.wait()
    with open(out) as f:
        lines = f.readlines()
    assert any("fstat" in l for l in lines), "strace saw none of the OPENs' fstat calls"
    def on_index(l):
        c = re.search(r"(?:pread64|fcntl)\((\d+),", l)
        return c is not None and c.group(1) in ifds
    index = [l for l in lines if on_index(l) and ("pread64(" in l or any(k in l for k in ("F_SETLK", "F_GETLK", "F_OFD_")))]
    assert index == [], f"{len(index)} index calls in 100 warm opens, e.g. {index[:3]}"


@pytest.mark.parametrize("access", [os.O_WRONLY, os.O_RDWR], ids=["write-only", "read-write"])
def test_a_file_written_in_many_writes_is_probed_for_capabilities_once(kfs, access):
    """Before each write(2) through the page cache the kernel asks whether the file has a security.capability
    to drop (a GETXATTR round trip), unless the inode is marked as having none, which the kernel does only
    on a filesystem that handles the killing itself (FUSE_HANDLE_KILLPRIV_V2, devio.c; fs/ops-io.c,
    SETUID). A runtime writing a kernel in chunks paid one round trip per chunk. A new file created
    write-only is written direct (fs/ops-io.c, CREATED FILES), which asks nothing at all: a publication is
    LOOKUP, CREATE, WRITE..., LOOKUP, RENAME."""
    m = kfs({})
    before = requests(m)
    fd = os.open(m.path("k.bin.tmp"), access | os.O_CREAT | os.O_EXCL, 0o644)
    for _ in range(16):
        assert os.write(fd, b"k" * 65536) == 65536
    os.close(fd)
    os.rename(m.path("k.bin.tmp"), m.path("k.bin"))
    d = delta(before, requests(m))
    assert d.get("WRITE") == 16, d
    probes = d.get("GETXATTR", 0) - 1  # 1: our own reading of the counters, the second one
    if access == os.O_WRONLY:
        assert probes == 0, f"16 direct writes sent {d}"
        assert waited_for(d) == {"LOOKUP": 2, "CREATE": 1, "WRITE": 16, "RENAME": 1}, f"a publication sent {d}"
    else:
        assert probes <= 1, f"16 writes sent {d}"
    with open(m.path("k.bin"), "rb") as f:
        assert f.read() == b"k" * (16 << 16)


@pytest.mark.parametrize("mode", ["passthrough", "page cache"])
def test_a_reader_sees_what_a_direct_writer_wrote(kfs, mode):
    """A new file's write-only handle is direct (fs/ops-io.c, CREATED FILES): its writes never pass
    through the FUSE inode's pages. A reader that opens the file meanwhile gets the page-cache mode, with
    passthrough on too (fs/passthrough.c), and must see a range it cached rewritten: Linux 6.18 drops the
    range's pages around a direct write (fs/fuse/file.c), so the reader's next read is a READ (that is
    the kernel's part, checked here: one READ, where a second pread of the cached range asked nothing).
    The daemon's part, for kernels that drop less: the direct write clears the inode's cache_ok, so the
    next open keeps none of the file's pages and reads all of it from the daemon (the file's bytes_read
    grows by its whole size). Without that, that open kept the cache and read only the dropped range."""
    m = kfs({"nopassthrough": mode == "page cache"})
    path = m.path("k.tmp")
    w = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:  # a hole at 4-60 KiB: the rewrite below allocates, as a runtime's sequential write does
        assert os.write(w, b"a" * 4096) == 4096 and os.pwrite(w, b"a" * 4096, 61440) == 4096
        old = b"a" * 4096 + bytes(57344) + b"a" * 4096
        r = os.open(path, os.O_RDONLY)
        try:
            assert os.pread(r, 65536, 0) == old  # cached now, in the page-cache mode
            before = requests(m)
            assert os.pread(r, 65536, 0) == old
            assert "READ" not in delta(before, requests(m)), "the range was not cached: nothing is checked"
            assert os.pwrite(w, b"b" * 4096, 8192) == 4096
            want = old[:8192] + b"b" * 4096 + old[12288:]
            before = requests(m)
            assert os.pread(r, 65536, 0) == want
            assert delta(before, requests(m)).get("READ", 0) >= 1
            served = int(os.getxattr(path, "user.kcachefs.bytes_read"))
            with open(path, "rb") as f:  # a new open, the writer still writing
                assert f.read() == want
            assert int(os.getxattr(path, "user.kcachefs.bytes_read")) - served == len(want), \
                "the open after a direct write kept pages of the file"
            assert os.pwrite(w, b"c" * 4096, 65536) == 4096  # past the end
            want += b"c" * 4096
            assert os.pread(r, 1 << 20, 0) == want
            assert os.fstat(r).st_size == len(want)
        finally:
            os.close(r)
    finally:
        os.close(w)
    with open(path, "rb") as f:
        assert f.read() == want
