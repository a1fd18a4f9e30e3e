"""FUSE over io_uring (fs/ring.c), through a real mount: negotiated when the kernel offers it, every
request but FORGET and INTERRUPT served through the per-CPU rings, replies sent later from other threads
(flock waits) delivered, the largest requests and replies intact, -o nouring honoured, and a daemon killed
with requests in its rings leaves nothing hanging."""
import contextlib
import fcntl
import os
import random
import re
import signal
import subprocess
import threading
import time

import pytest

from conftest import abort_test_mounts, kcachefs_bin, private_dir, wait_for
from test_hot_path import every_open_released, refresh_child, requests

SWITCH = "/sys/module/fuse/parameters/enable_uring"
RING_THREADS_PER_CPU = 2  # fs/ring.c RING_THREADS
RING = {"uring": True, "nouring": False}  # io_uring on where the kernel offers it, whatever KCACHEFS_MOUNT_OPTS says


@contextlib.contextmanager
def kernel_knob(path, value):
    """path (a /sys or /proc setting) reads value inside the block, and what it read before after it."""
    with open(path) as f:
        was = f.read().strip()
    try:
        with open(path, "w") as f:
            f.write(f"{value}\n")
        yield
    finally:
        with open(path, "w") as f:
            f.write(was + "\n")


def transport(m):
    return os.getxattr(m.mnt, "user.kcachefs.transport").decode()


def ring_requests(m):
    return int(os.getxattr(m.mnt, "user.kcachefs.ring_requests"))


@pytest.fixture
def ringmount(kfs):
    def make(opts=None, **kw):
        m = kfs({**RING, **(opts or {})}, **kw)
        t = transport(m)
        if "does not offer" in t:
            pytest.skip(f"this kernel has no FUSE over io_uring ({t})")
        assert t.startswith("io_uring ("), t
        return m
    return make


def workload(root):
    """Most request types, with their results checked."""
    d = os.path.join(root, "a", "b")
    os.makedirs(d)
    data = os.urandom(3 * 1024 * 1024 + 17)  # more than one 1 MiB request
    with open(os.path.join(d, "f.tmp"), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(os.path.join(d, "f.tmp"), os.path.join(d, "f"))
    os.setxattr(os.path.join(d, "f"), "user.x", b"y")
    assert os.getxattr(os.path.join(d, "f"), "user.x") == b"y"
    assert os.stat(os.path.join(d, "f")).st_size == len(data)
    with open(os.path.join(d, "f"), "rb") as f:
        assert f.read() == data
    os.symlink("f", os.path.join(d, "l"))
    assert os.readlink(os.path.join(d, "l")) == "f"
    assert sorted(os.listdir(d)) == ["f", "l"]
    for i in range(50):
        with open(os.path.join(d, f"s{i}"), "w") as f:
            f.write(str(i))
    assert all(open(os.path.join(d, f"s{i}")).read() == str(i) for i in range(50))
    os.truncate(os.path.join(d, "f"), 10)
    assert open(os.path.join(d, "f"), "rb").read() == data[:10]
    for n in os.listdir(d):
        os.unlink(os.path.join(d, n))
    os.rmdir(d)


@pytest.mark.parametrize("reads", ["passthrough", "page cache"])
def test_requests_go_through_the_rings(ringmount, reads):
    m = ringmount({"nopassthrough": reads == "page cache"})
    before = ring_requests(m)
    workload(m.mnt)
    # Every one of those requests came through a ring: there are hundreds of them.
    assert ring_requests(m) - before > 300
    # From every CPU: each has its own queue, served by threads pinned to it.
    for cpu in sorted(os.sched_getaffinity(0)):
        r = os.fork()
        if r == 0:
            try:
                os.sched_setaffinity(0, {cpu})
                for i in range(20):
                    with open(os.path.join(m.mnt, f"cpu{cpu}-{i}"), "wb") as f:
                        f.write(b"x" * 4096)
                os._exit(0)
            except BaseException:
                os._exit(1)
        assert os.waitpid(r, 0)[1] == 0
    assert all(os.path.getsize(m.path(f"cpu{c}-{i}")) == 4096 for c in os.sched_getaffinity(0) for i in range(20))


def test_nouring_takes_everything_through_dev_fuse(kfs):
    m = kfs({"nouring": True})
    assert transport(m) == "/dev/fuse (-o nouring)"
    workload(m.mnt)
    assert ring_requests(m) == 0


def test_the_switch_is_turned_on_by_a_root_daemon_and_left_alone_with_nouring(kfs):
    if not os.path.exists(SWITCH):
        pytest.skip("this kernel has no FUSE over io_uring (Linux 6.14+)")
    if tuple(int(x) for x in os.uname().release.split(".")[:2]) < (6, 18):
        pytest.skip("the daemon turns the switch on only on kernels it was tried on (6.18+)")
    with kernel_knob(SWITCH, "N"):
        m = kfs({"nouring": True})
        assert open(SWITCH).read().strip() == "N"
        assert transport(m) == "/dev/fuse (-o nouring)"
        m.stop()
        m.opts.update(RING)
        m.start()
        assert open(SWITCH).read().strip() == "Y"
        assert "turned on FUSE over io_uring" in m.stderr
        assert transport(m).startswith("io_uring (")


def test_replies_sent_later_from_other_threads_arrive(ringmount):
    """flock() waits are answered from threads of their own: each holds its ring entry until then, and
    the daemon must keep taking requests meanwhile (the unlock among them)."""
    m = ringmount()
    path = m.path("lockfile")
    open(path, "w").close()
    holder = open(path)
    fcntl.flock(holder, fcntl.LOCK_EX)
    got = []
    lock = threading.Lock()

    def waiter():
        with open(path) as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            with lock:
                got.append(1)
            fcntl.flock(f, fcntl.LOCK_UN)

    threads = [threading.Thread(target=waiter) for _ in range(40)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # all queued on the lock, each holding an entry
    before = ring_requests(m)
    assert sorted(os.listdir(m.mnt)).count("lockfile") == 1  # still answering
    assert ring_requests(m) > before
    fcntl.flock(holder, fcntl.LOCK_UN)
    holder.close()
    for t in threads:
        t.join(timeout=30)
    assert len(got) == 40


def test_a_burst_of_waits_that_takes_every_entry_stalls_no_queue(ringmount):
    """64 flock() waits at once take every ring entry of both queues before the daemon can register new
    ones; requests queued in that moment must still be served (ring.c, A QUEUE NEVER STALLS), on every
    CPU's queue, without any unrelated request coming to unblock them."""
    m = ringmount()
    path = m.path("lockfile")
    open(path, "w").close()
    cpus = sorted(os.sched_getaffinity(0))
    for rnd in range(12):  # the race is narrow: about 1 round in 4 hung before the fix
        m.stop()
        m.start()  # fresh rings: two entries per queue, as at every mount
        holder = open(path)
        fcntl.flock(holder, fcntl.LOCK_EX)
        barrier = threading.Barrier(65)

        def waiter():
            with open(path) as f:
                barrier.wait()
                fcntl.flock(f, fcntl.LOCK_EX)
                fcntl.flock(f, fcntl.LOCK_UN)

        threads = [threading.Thread(target=waiter, daemon=True) for _ in range(64)]
        for t in threads:
            t.start()
        barrier.wait()
        stuck = []
        for cpu in cpus:
            p = subprocess.run(["taskset", "-c", str(cpu), "timeout", "10", "ls", m.mnt], capture_output=True)
            if p.returncode != 0:
                stuck.append(cpu)
        if stuck:  # the waiters' own requests are stuck too: end the mount, so nothing is left hanging
            abort_test_mounts()
            pytest.fail(f"round {rnd}: ls of the mount hung on CPU(s) {stuck} behind 64 flock waits")
        fcntl.flock(holder, fcntl.LOCK_UN)
        holder.close()
        deadline = time.monotonic() + 30
        for t in threads:
            t.join(timeout=max(deadline - time.monotonic(), 0.1))
        if any(t.is_alive() for t in threads):
            abort_test_mounts()
            pytest.fail(f"round {rnd}: waiters still blocked 30 s after the unlock")


def ring_entries(m):
    """(queues, entries) as user.kcachefs.transport says them."""
    t = transport(m)
    mt = re.fullmatch(r"io_uring \((\d+) queues, (\d+) entries\)", t)
    assert mt, t
    return int(mt.group(1)), int(mt.group(2))


def test_waits_one_after_another_add_no_entries(ringmount):
    """A ring thread registers a new entry for a reply it holds back (a flock() that waits) only where none
    of its entries waits in the kernel, and an entry whose reply went waits again (ring.c, handle): 40
    waits, one after the other, leave each thread at most one entry more. A new entry for every wait made
    the rings grow with every wait the mount ever served, a 1 MiB mapping and a kernel entry each."""
    m = ringmount()
    path = m.path("lockfile")
    open(path, "w").close()
    queues, _ = ring_entries(m)
    rings = 2 * queues  # ring.c's RING_THREADS per queue, one entry each (they may still be registering)
    waited = 0
    for _ in range(40):
        holder = open(path)
        fcntl.flock(holder, fcntl.LOCK_EX)
        f = open(path)
        t = threading.Thread(target=lambda: (fcntl.flock(f, fcntl.LOCK_EX), fcntl.flock(f, fcntl.LOCK_UN)))
        setlkw = requests(m).get("SETLKW", 0)
        t.start()
        wait_for(lambda: requests(m).get("SETLKW", 0) > setlkw, what="the waiter's request")
        time.sleep(0.02)  # taken and found held: its reply is held back
        waited += t.is_alive()
        fcntl.flock(holder, fcntl.LOCK_UN)
        holder.close()
        t.join(30)
        assert not t.is_alive(), "the waiter was never answered"
        f.close()
    _, after = ring_entries(m)
    assert waited >= 30, waited  # the replies were held back, as the test needs
    assert after <= 2 * rings, f"{after} entries for {rings} ring threads after 40 waits"


def cpus_allowed(path):
    with open(os.path.join(path, "status")) as f:
        line = next(x for x in f if x.startswith("Cpus_allowed_list:"))
    return line.split(":", 1)[1].strip()


def test_threads_started_while_serving_run_on_every_cpu(ringmount):
    """The daemon's background threads start at the first request that needs them, served by a ring thread
    pinned to its queue's CPU; they must not stay on that CPU (fs/thread.c). After a write (the settler),
    reads (the refresher and its child, as root) and evictions (the reapers, the descent, kprune), only
    the ring threads are pinned to one CPU."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: nothing to pin to")
    m = ringmount({"max_size": "1M", "grace_ms": "0"})
    queues, _ = ring_entries(m)
    rings = 2 * queues  # ring.c's RING_THREADS per queue
    everywhere = cpus_allowed("/proc/self")
    for i in range(12):
        with open(m.path(f"f{i}"), "wb") as f:
            f.write(os.urandom(256 << 10))
        with open(m.path(f"f{i}"), "rb") as f:
            f.read()
    time.sleep(1.5)  # the settler's second, the refresher's batch
    daemon = m.pid()
    task = f"/proc/{daemon}/task"
    pinned = [t for t in os.listdir(task) if cpus_allowed(os.path.join(task, t)) != everywhere]
    assert int(os.getxattr(m.mnt, "user.kcachefs.evicted_files")) > 0
    assert len(os.listdir(task)) > rings + 2  # background threads were started
    assert len(pinned) == rings, f"{len(pinned)} of the daemon's threads on one CPU, {rings} ring threads"
    if os.geteuid() == 0:
        child = wait_for(lambda: refresh_child(m), what="the refresher's child")
        assert cpus_allowed(f"/proc/{child}") == everywhere


def test_a_nudge_reaches_only_the_mount_it_was_made_for(ringmount, workdir):
    """A nudge's helper (ring.c) statfs'es the mount as root, and a mount point may lie in a user's
    directory: the user can rename a directory above it, and put a symlink or a mount of their own (a FUSE
    mount that never answers) where the mount point was. The helper gets the mount point's directory as
    the daemon held it since mount (descriptor 3) and the mount point's name: it follows no symlink there,
    and makes its request only where it reached the mount's own device (renames above that directory
    change nothing, since it is held). One STATFS through the mount point's name; none through a symlink
    to it, or with another device."""
    m = ringmount()
    st = os.stat(m.mnt)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    parent, name = os.path.split(m.mnt)
    links = os.path.join(workdir[0], "links")
    os.mkdir(links)
    os.symlink(m.mnt, os.path.join(links, name))

    def nudge(dirpath, d):
        dirfd = os.open(dirpath, os.O_PATH | os.O_DIRECTORY)
        try:
            before = requests(m).get("STATFS", 0)
            rc = subprocess.run(["bash", "-c", 'exec 3<&"$1" && exec "$2" --nudge 0 "$3" "$4"', "nudge", str(dirfd),
                                 kcachefs_bin(), name, d], timeout=30, pass_fds=(dirfd,)).returncode
            return rc, requests(m).get("STATFS", 0) - before
        finally:
            os.close(dirfd)

    assert nudge(parent, dev) == (0, 1)
    assert nudge(links, dev) == (1, 0)
    other = os.stat(workdir[0]).st_dev
    assert nudge(parent, f"{os.major(other)}:{os.minor(other)}") == (1, 0)


def test_a_daemon_killed_with_requests_in_its_rings_leaves_nothing_hanging(ringmount):
    m = ringmount()
    path = m.path("lockfile")
    with open(m.path("kept"), "wb") as f:
        f.write(b"k" * 100000)
    open(path, "w").close()
    holder = open(path)
    fcntl.flock(holder, fcntl.LOCK_EX)
    # A process blocked in a request the daemon holds (a flock wait), and one reading in a loop.
    waiter = subprocess.Popen(["python3", "-c", f"import fcntl; f = open({path!r}); fcntl.flock(f, fcntl.LOCK_EX)"],
                              stderr=subprocess.PIPE, text=True)
    reader = subprocess.Popen(["sh", "-c", f"while cat {m.path('kept')} >/dev/null; do :; done; exit 1"],
                              stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    m.kill()
    assert waiter.wait(timeout=30) != 0  # the kernel ended its request (ECONNABORTED/ENOTCONN)
    assert reader.wait(timeout=30) != 0
    holder.close()
    m.start()
    assert open(m.path("kept"), "rb").read() == b"k" * 100000
    assert transport(m).startswith("io_uring (")


def test_a_kernel_that_refuses_io_uring_leaves_dev_fuse_serving(kfs):
    """The kernel offers FUSE over io_uring but io_uring itself is refused (kernel.io_uring_disabled=2, as
    hardened systems set it). Once INIT asks for io_uring the kernel holds every request until the rings
    are registered, so the daemon must find this out before asking: it says why, and /dev/fuse serves."""
    knob = "/proc/sys/kernel/io_uring_disabled"
    if not os.path.exists(knob):
        pytest.skip("no kernel.io_uring_disabled here (Linux 6.6+)")
    with kernel_knob(knob, 2):
        m = kfs(RING)
        t = transport(m)  # the first request: INIT has been answered, the choice made
    if "does not offer" in t:
        pytest.skip(f"this kernel has no FUSE over io_uring ({t})")
    assert t == "/dev/fuse (io_uring unavailable: Operation not permitted)", t
    workload(m.mnt)
    assert ring_requests(m) == 0


def test_a_tasks_limit_that_leaves_a_queue_without_a_thread_falls_back(workdir):
    """Under a tasks limit (systemd's TasksMax, a pids cgroup) some ring threads cannot start. A queue
    left without one would keep the kernel waiting for the rings forever; the daemon must tell it to give
    them up, and then /dev/fuse serves. Tried with limits from too few threads to enough."""
    pids = "/sys/fs/cgroup/pids"
    if not os.path.isdir(pids) or not os.path.exists(SWITCH):
        pytest.skip("needs a cgroup v1 pids controller and FUSE over io_uring")
    d, _ = workdir
    cg = os.path.join(pids, f"kcachefs-test-{os.getpid()}")
    os.mkdir(cg)
    seen = set()
    try:
        for limit in range(3, 3 + 3 * RING_THREADS_PER_CPU * len(os.sched_getaffinity(0))):
            b, m = os.path.join(private_dir(d), f"b{limit}"), os.path.join(d, f"m{limit}")
            os.makedirs(b)
            os.makedirs(m)
            with open(os.path.join(cg, "pids.max"), "w") as f:
                f.write(f"{limit}\n")
            p = subprocess.Popen(["sh", "-c", f"echo $$ > {cg}/cgroup.procs && exec {kcachefs_bin()} -f "
                                  f"-o max_size=10M,uring {b} {m}"], stderr=subprocess.PIPE, text=True)
            try:
                wait_for(lambda: os.path.ismount(m), what="mount")
                t = os.getxattr(m, "user.kcachefs.transport").decode()
                with open(os.path.join(m, "f"), "w") as f:
                    f.write("served")
                assert open(os.path.join(m, "f")).read() == "served"
                if t.startswith("io_uring ("):
                    seen.add("io_uring")
                else:
                    assert t.startswith("/dev/fuse (io_uring did not start on every queue: "), t
                    seen.add("/dev/fuse")
            finally:
                subprocess.run(["fusermount3", "-u", m], capture_output=True)
                p.wait(timeout=30)
            if seen == {"io_uring", "/dev/fuse"}:
                break
        assert "/dev/fuse" in seen  # the smallest limits leave a queue without a thread
    finally:
        os.rmdir(cg)


def direct_requests(m):
    return int(os.getxattr(m.mnt, "user.kcachefs.direct_requests"))


@pytest.mark.parametrize("reads", ["passthrough", "page cache"])
def test_opens_and_releases_on_the_rings_are_answered_without_libfuse(ringmount, reads):
    """fs/direct.c: every OPEN and RELEASE that comes through a ring is answered by the daemon itself, and
    its reply says what libfuse's would: a passthrough open reads with no READ to the daemon (the backing
    id and FOPEN_PASSTHROUGH reached the kernel), a page-cache open of an unchanged file keeps its pages
    (FOPEN_KEEP_CACHE), and every handle is released (the descriptors the daemon holds come back)."""
    m = ringmount({"nopassthrough": reads == "page cache"})
    data = {f"k{i}": os.urandom(4096 + i) for i in range(40)}
    for n, d in data.items():
        with open(m.path(n), "wb") as f:
            f.write(d)
    for n, d in data.items():  # a first read: the page cache fills (or passthrough registers)
        with open(m.path(n), "rb") as f:
            assert f.read() == d
    wait_for(lambda: every_open_released(m), what="every RELEASE")
    before, direct = requests(m), direct_requests(m)
    for _ in range(3):
        for n, d in data.items():
            with open(m.path(n), "rb") as f:
                assert f.read() == d
    wait_for(lambda: requests(m).get("RELEASE", 0) - before.get("RELEASE", 0) >= 3 * len(data),
             what="the hits' RELEASEs")
    after = requests(m)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert d.get("OPEN") == d.get("RELEASE") == 3 * len(data), d
    assert direct_requests(m) - direct == 2 * 3 * len(data)
    assert d.get("READ", 0) == 0, d  # passthrough: the kernel read the backing files; page cache: kept
    assert "matches" in subprocess.run([os.path.join(os.path.dirname(kcachefs_bin()), "kcache"), "verify", m.mnt],
                                       capture_output=True, text=True, timeout=60).stdout


def test_allow_root_leaves_every_request_to_libfuse(ringmount):
    """libfuse's allow_root refuses every user but the mount's owner and root, in libfuse: with it, the
    rings hand OPEN to libfuse too (main.c), so another user's open of a name root looked up (the kernel
    holds the dentry: no LOOKUP for libfuse to refuse) is still refused."""
    from conftest import ensure_user
    m = ringmount({"allow_root": True})
    os.chmod(m.mnt, 0o1777)
    with open(m.path("k"), "wb") as f:
        f.write(b"k" * 100)
    os.chmod(m.path("k"), 0o644)
    with open(m.path("k"), "rb") as f:
        assert f.read() == b"k" * 100
    alice = ensure_user("kcfs-alice")
    p = subprocess.run(["runuser", "-u", alice.pw_name, "--", "/usr/bin/python3", "-c",
                        "import sys\ntry:\n    open(sys.argv[1], 'rb').read()\n    print(0)\n"
                        "except OSError as e:\n    print(e.errno)", m.path("k")],
                       capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == str(__import__("errno").EACCES), (p.stdout, p.stderr)
    assert direct_requests(m) == 0


def test_interrupts_for_direct_opens_never_reach_libfuse(ringmount):
    """fs/direct.c, INTERRUPT: a signal that lands while an OPEN is in the daemon makes the kernel send an
    INTERRUPT for it. libfuse cannot find a request it never ran; it would keep every such INTERRUPT, and
    walk them all under its session lock at each request it runs after. The daemon keeps them from libfuse
    (devio.c), including those read before the ring thread got to the OPEN (with the note alone, 3 and 4
    of 5 were kept in two runs here, 5 of 5 in two others: this catches that race only at times; it
    catches INTERRUPTs left to libfuse at all every time). The opener sends nothing else (no FLUSH: noflush; no LOOKUP or
    GETATTR: the name and attributes are cached), and a RELEASE is never interrupted, so every INTERRUPT
    is one for a direct OPEN. (That an INTERRUPT for a request libfuse runs still reaches it is
    test_remote.py's herd tests, on rings where the kernel offers them.)"""
    m = ringmount()
    path = m.path("k")
    with open(path, "wb") as f:
        f.write(b"k")
    open(path, "rb").close()
    interrupts = lambda: requests(m).get("INTERRUPT", 0)
    kept = lambda: int(os.getxattr(m.mnt, "user.kcachefs.direct_interrupts"))
    before, dropped = interrupts(), kept()
    cpus = sorted(os.sched_getaffinity(0))
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # opens and closes the file under a rain of signals, with a handler: each may interrupt
        try:
            os.sched_setaffinity(0, {cpus[0]})
            signal.signal(signal.SIGUSR1, lambda *a: None)
            os.write(ready_w, b"1")
            end = time.monotonic() + 70
            while time.monotonic() < end:
                os.close(os.open(path, os.O_RDWR))  # read-write: the daemon opens the file, a longer OPEN
        finally:
            os._exit(0)
    os.close(ready_w)
    sender = None
    try:
        assert os.read(ready_r, 1) == b"1"  # its handler is in: a signal no longer ends it
        sender = os.fork()
        # On another CPU where there is one: its signals land while the opener waits. They come spaced by
        # 0 to 200 us at random. Over io_uring the kernel sends an INTERRUPT only for a signal that comes
        # once the ring thread has the OPEN (FR_SENT); one that comes before ends the interruptible part of
        # the wait with nothing sent, and the rest of that open waits killable only, deaf to the signals
        # after it (request_wait_answer). A flood had one pending as nearly every open began to wait: 2 to
        # 35 s for 5 INTERRUPTs under ASan, at times over 60; spaced, 0.5 s.
        if sender == 0:
            try:
                os.sched_setaffinity(0, {cpus[-1]})
                rng = random.Random(pid)
                while True:
                    os.kill(pid, signal.SIGUSR1)
                    until = time.perf_counter_ns() + rng.randrange(200_000)
                    while time.perf_counter_ns() < until:
                        pass
            finally:
                os._exit(0)
        deadline = time.monotonic() + 60
        while interrupts() - before < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        os.close(ready_r)
        for p in (sender, pid):
            if p:
                os.kill(p, signal.SIGKILL)
                os.waitpid(p, 0)
    wait_for(lambda: every_open_released(m), what="every RELEASE")
    n = interrupts() - before
    assert n >= 5, f"only {n} INTERRUPTs in 60 s of signals"
    # the opener's SIGKILL may have sent one more, read a moment later: the two counts agree once it is
    wait_for(lambda: kept() - dropped == interrupts() - before, timeout=5,
             what=f"every INTERRUPT kept from libfuse ({kept() - dropped} of {interrupts() - before})")
