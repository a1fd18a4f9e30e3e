"""The generic POSIX behaviour every runtime in runtimes.md relies on, through a real mount."""
import ctypes
import errno
import fcntl
import mmap
import multiprocessing as mp
import os
import resource
import shutil
import signal
import stat
import subprocess
import threading
import time

import pytest

from conftest import ensure_user, wait_for


def write(path, data, mode="wb"):
    with open(path, mode) as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def _excl_worker(path, barrier, q):
    barrier.wait()
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o200)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        q.put("won")
    except FileExistsError:
        q.put("lost")


def test_o_excl_race_has_exactly_one_winner(kfs):
    m = kfs()
    ctx = mp.get_context("fork")
    for round_ in range(20):
        path = m.path(f"lock{round_}.lock")
        barrier, q = ctx.Barrier(8), ctx.Queue()
        procs = [ctx.Process(target=_excl_worker, args=(path, barrier, q)) for _ in range(8)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        results = sorted(q.get() for _ in procs)
        assert results.count("won") == 1, results
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o200  # SYCL's odd lock mode


def test_rename_over_open_file_reader_keeps_old_bytes(kfs):
    m = kfs()
    os.makedirs(m.path("a"))
    os.makedirs(m.path("b"))
    write(m.path("b", "target"), b"old" * 1000)
    reader = open(m.path("b", "target"), "rb")
    write(m.path("a", "tmp.123"), b"new" * 1000)
    os.rename(m.path("a", "tmp.123"), m.path("b", "target"))  # across directories, over a file
    assert reader.read() == b"old" * 1000
    reader.close()
    assert read(m.path("b", "target")) == b"new" * 1000
    assert not os.path.exists(m.path("a", "tmp.123"))


def test_rename_noreplace_and_exchange(kfs):
    m = kfs()
    write(m.path("x"), b"x")
    write(m.path("y"), b"y")
    libc = ctypes.CDLL(None, use_errno=True)
    AT_FDCWD, NOREPLACE, EXCHANGE = -100, 1, 2
    r = libc.renameat2(AT_FDCWD, m.path("x").encode(), AT_FDCWD, m.path("y").encode(), NOREPLACE)
    assert r == -1 and ctypes.get_errno() == errno.EEXIST
    r = libc.renameat2(AT_FDCWD, m.path("x").encode(), AT_FDCWD, m.path("y").encode(), EXCHANGE)
    assert r == 0
    assert read(m.path("x")) == b"y" and read(m.path("y")) == b"x"


def test_unlink_while_open_and_while_mmapped(kfs):
    m = kfs()
    data = os.urandom(200000)
    write(m.path("f"), data)
    f = open(m.path("f"), "rb")
    g = open(m.path("f"), "rb")
    mm = mmap.mmap(g.fileno(), 0, prot=mmap.PROT_READ)
    g.close()
    os.unlink(m.path("f"))
    assert not os.path.exists(m.path("f"))
    assert f.read() == data
    assert mm[:] == data
    assert os.fstat(f.fileno()).st_nlink == 0
    mm.close()
    f.close()


def test_mmap_shared_write(kfs):
    m = kfs()
    write(m.path("f"), b"\0" * 8192)
    with open(m.path("f"), "r+b") as f:
        mm = mmap.mmap(f.fileno(), 8192)
        mm[100:105] = b"hello"
        mm.flush()
        mm.close()
    assert read(m.path("f"))[100:105] == b"hello"
    assert read(os.path.join(m.backing, "f"))[100:105] == b"hello"


def test_dlopen_from_the_mount(kfs, tmp_path):
    m = kfs()
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    src = tmp_path / "k.c"
    src.write_text("int kernel_answer(void) { return 42; }\n")
    so = m.path("cache", "k.so")
    os.makedirs(m.path("cache"))
    tmp = so + ".tmp"
    subprocess.run([cc, "-shared", "-fPIC", "-o", tmp, str(src)], check=True)
    os.rename(tmp, so)
    # In a child process, so that the mapping ends with it and the mount can be unmounted.
    code = f"import ctypes; print(ctypes.CDLL({so!r}).kernel_answer())"
    out = subprocess.run(["python3", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "42"  # exec mmap from the mount


def _flock_holder(path, locked, release):
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    locked.set()
    release.wait(30)
    os.close(fd)


def start_flock_holder(path):
    """A process holding LOCK_EX on path until release.set(); returns (process, release)."""
    ctx = mp.get_context("fork")
    locked, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_flock_holder, args=(path, locked, release))
    p.start()
    assert locked.wait(10)
    return p, release


def test_flock_excludes_between_processes(kfs):
    m = kfs()
    write(m.path("config.file"), b"\0" * 8)
    p, release = start_flock_holder(m.path("config.file"))
    fd = os.open(m.path("config.file"), os.O_RDWR)
    try:  # closed whatever happens: an open file would keep the mount busy after the test
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        release.set()
        p.join(10)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # now free
        # POSIX record locks work too.
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 4, 0)
    finally:
        os.close(fd)


def _keep_writing(path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    while True:
        os.pwrite(fd, b"z" * (1 << 20), 0)


@pytest.mark.parametrize("how", ["passthrough", "nopassthrough"])
def test_a_lock_left_at_close_is_free_once_the_release_came(kfs, how):
    # flock(2) then close(2) without LOCK_UN: the lock goes with the last close. The daemon must let go of
    # it at RELEASE even where its backing fd has another reference: passthrough's registered backing file
    # (the kernel keeps it until the inode is forgotten), a helper being spawned (fs/flock.c, LET GO AT
    # RELEASE).
    m = kfs({"nopassthrough": how == "nopassthrough"})
    path = m.path("held")
    write(path, b"x")
    for i in range(5):
        fd = os.open(path, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.close(fd)  # its RELEASE follows, in the background

        def free():
            fd = os.open(path, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False
            finally:
                os.close(fd)  # ours goes with it, at its RELEASE
        wait_for(free, timeout=5, what=f"the lock left at close (round {i}) to be free")


@pytest.mark.parametrize("transport", ["uring", "nouring"])
def test_flock_is_free_once_its_holder_exited(kfs, transport):
    # Through FUSE a holder's last close only queues a RELEASE; a process that saw the holder exit must
    # still find the lock free at once, as on a local filesystem, even while the holder's CPU is busy
    # with other requests (with io_uring, its RELEASE then waits in that CPU's queue while ours does not).
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    cpu_a, cpu_b = sorted(os.sched_getaffinity(0))[:2]
    m = kfs({"uring": transport == "uring", "nouring": transport == "nouring"})
    path = m.path("config.file")
    write(path, b"\0" * 8)
    ctx = mp.get_context("fork")
    busy = []
    for i in range(2):
        b = ctx.Process(target=_keep_writing, args=(m.path(f"busy{i}"),))
        b.start()
        os.sched_setaffinity(b.pid, {cpu_a})
        busy.append(b)
    me = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu_b})
    try:
        for i in range(40):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the holder: on the busy CPU, locks, then exits or is killed without unlocking
                try:
                    os.sched_setaffinity(0, {cpu_a})
                    fd = os.open(path, os.O_RDWR)
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    os.write(w, b"x")
                    while i % 2:
                        signal.pause()  # until SIGKILL
                finally:
                    os._exit(0)
            os.close(w)
            assert os.read(r, 1) == b"x"
            if i % 2:
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            fd = os.open(path, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: its holder is gone
            finally:
                os.close(fd)
    finally:
        os.sched_setaffinity(0, me)
        for b in busy:
            b.kill()
            b.join()


def _flock_inheritor(path, locked, release):
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    if os.fork() == 0:  # the child keeps the lock (one open file description) after its parent exits
        locked.set()
        release.wait(30)
        os._exit(0)
    os._exit(0)


def test_many_holders_of_one_lock_never_slow_everyone_elses_locks(kfs):
    """A process takes LOCK_SH on 2,000 descriptors of its own file, and another keeps trying LOCK_EX |
    LOCK_NB on it. Each failed try looked, under the daemon's one flock lock, for a holder whose thread
    had exited, by reading /proc for every holder of the file: about 2,000 reads a try, while every other
    flock() and every RELEASE of the mount waited for that lock. Now each thread is read once, after the
    lock is let go (fs/flock.c, PROC OUTSIDE THE LOCK): another user's lock and unlock of another file
    costs about what it costs with nobody trying."""
    m = kfs({})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    path, other = m.path("x"), m.path("y")
    open(path, "w").close()
    open(other, "w").close()

    def lock_unlock(n):
        t = time.monotonic()
        with open(other) as f:
            for _ in range(n):
                fcntl.flock(f, fcntl.LOCK_EX)
                fcntl.flock(f, fcntl.LOCK_UN)
        return time.monotonic() - t

    alone = min(lock_unlock(100) for _ in range(3))
    held = []
    try:
        for _ in range(2000):
            f = open(path)
            fcntl.flock(f, fcntl.LOCK_SH)
            held.append(f)
        stop = threading.Event()
        tries = [0]

        def trier():
            with open(path) as f:
                while not stop.is_set():
                    try:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        tries[0] += 1

        threads = [threading.Thread(target=trier) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.2)
            busy = lock_unlock(100)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
    finally:
        for f in held:
            f.close()
    assert tries[0] > 20, tries[0]  # the tries really ran meanwhile
    assert busy < 10 * alone + 0.5, f"100 locks and unlocks of another file: {busy:.2f} s, {alone:.3f} s alone"


def test_a_user_waiting_on_too_many_locks_gets_enolck_and_others_still_wait(kfs):
    """Each flock() that must wait is waited for on a thread of the daemon's own (fs/flock.c, WAITS); one
    user has 512 of them at most, and a wait past that is answered ENOLCK at once. Without the bound a user
    blocking on locks of their own took threads until none could be made, and then the next wait was
    waited for on the thread serving that CPU's queue: every user's requests there stopped. Another user's
    wait, past the first user's 512, still waits and gets its lock."""
    if os.geteuid() != 0:
        pytest.skip("needs root for a second account")
    m = kfs({"allow_other": True, "default_permissions": True})
    path = m.path("x")
    open(path, "w").close()
    os.chmod(path, 0o666)
    holder = open(path)
    fcntl.flock(holder, fcntl.LOCK_EX)
    results = []

    def waiter():
        with open(path) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX)
                fcntl.flock(f, fcntl.LOCK_UN)
                results.append(0)
            except OSError as e:
                results.append(e.errno)

    threads = [threading.Thread(target=waiter) for _ in range(513)]
    other = None
    try:
        for t in threads:
            t.start()
        wait_for(lambda: results, timeout=60, what="the wait past 512 answered")
        assert results == [errno.ENOLCK], results[:5]
        alice = ensure_user("kcfs-alice")
        code = ("import fcntl, sys\n"
                "f = open(sys.argv[1])\n"
                "print('waiting', flush=True)\n"
                "fcntl.flock(f, fcntl.LOCK_EX)\n"
                "print('locked', flush=True)")
        other = subprocess.Popen(["runuser", "-u", alice.pw_name, "--", "/usr/bin/python3", "-c", code, path],
                                 stdout=subprocess.PIPE, text=True)
        assert other.stdout.readline().strip() == "waiting"
        time.sleep(0.5)
        assert other.poll() is None and len(results) == 1, "another user's wait was refused"
    finally:
        fcntl.flock(holder, fcntl.LOCK_UN)
        holder.close()
        for t in threads:
            t.join(60)
    assert other.stdout.readline().strip() == "locked"
    assert other.wait(30) == 0
    assert sorted(results) == [0] * 512 + [errno.ENOLCK]


def test_flock_inherited_by_a_child_stays_held_after_the_locker_exits(kfs):
    m = kfs()
    path = m.path("config.file")
    write(path, b"\0" * 8)
    ctx = mp.get_context("fork")
    locked, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_flock_inheritor, args=(path, locked, release))
    p.start()
    assert locked.wait(10)
    wait_for(lambda: p.exitcode is not None, what="the locker's exit")  # not join(): the child holds its pipe
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):  # its taker is gone, but the lock lives on in the child
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        release.set()
        wait_for(lambda: flock_nb(fd), what="the lock, once the child exited")
    finally:
        os.close(fd)


def flock_nb(fd):
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _flock_queuer(path, q):
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # queues behind the holder, as NEO's processes do on config.file
    q.put(os.getpid())
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def test_queued_flock_waiters_hold_no_worker(kfs):
    # The daemon has as many workers as CPUs; 24 processes waiting for one lock must not take them all:
    # the filesystem keeps answering, and the holder's unlock gets through.
    m = kfs()
    write(m.path("config.file"), b"\0" * 8)
    write(m.path("other"), b"x" * 4096)
    holder, release = start_flock_holder(m.path("config.file"))
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    waiters = [ctx.Process(target=_flock_queuer, args=(m.path("config.file"), q)) for _ in range(24)]
    for w in waiters:
        w.start()
    wait_for(lambda: len([line for line in open("/proc/locks") if "FLOCK" in line and "->" in line]) >= 24,
             what="24 queued flock waiters")
    for i in range(50):  # the workers are free
        write(m.path(f"n{i}"), b"y")
        assert read(m.path("other")) == b"x" * 4096
    release.set()
    holder.join(10)
    got = {q.get(timeout=20) for _ in waiters}
    for w in waiters:
        w.join(10)
    assert len(got) == 24


def test_fsync_and_fdatasync(kfs):
    m = kfs()
    fd = os.open(m.path("f"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.write(fd, b"data")
    os.fdatasync(fd)
    os.fsync(fd)
    os.close(fd)
    dfd = os.open(m.mnt, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)


def test_attributes_links_and_readdir(kfs):
    m = kfs()
    os.makedirs(m.path("d", "e"))
    write(m.path("d", "f"), b"12345")
    os.symlink("f", m.path("d", "s"))
    os.link(m.path("d", "f"), m.path("d", "e", "hard"))
    assert os.readlink(m.path("d", "s")) == "f"
    assert read(m.path("d", "s")) == b"12345"
    assert os.stat(m.path("d", "f")).st_nlink == 2
    os.chmod(m.path("d", "f"), 0o640)
    assert stat.S_IMODE(os.stat(m.path("d", "e", "hard")).st_mode) == 0o640
    os.chown(m.path("d", "f"), 1234, 5678)
    st = os.stat(m.path("d", "f"))
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    os.truncate(m.path("d", "f"), 2)
    assert read(m.path("d", "f")) == b"12"
    os.utime(m.path("d", "f"), ns=(1_000_000_123, 2_000_000_456))
    st = os.stat(m.path("d", "f"))
    assert st.st_mtime_ns == 2_000_000_456 and st.st_atime_ns == 1_000_000_123
    types = {e.name: (e.is_dir(follow_symlinks=False), e.is_symlink(), e.is_file(follow_symlinks=False))
             for e in os.scandir(m.path("d"))}
    assert types == {"e": (True, False, False), "s": (False, True, False), "f": (False, False, True)}
    # The metadata directory never shows.
    assert ".kcachefs" not in os.listdir(m.mnt)
    assert not os.path.exists(m.path(".kcachefs"))
    with pytest.raises(OSError):
        os.mkdir(m.path(".kcachefs"))
    os.unlink(m.path("d", "e", "hard"))
    assert os.stat(m.path("d", "f")).st_nlink == 1
    with pytest.raises(OSError) as e:
        os.rmdir(m.path("d"))
    assert e.value.errno == errno.ENOTEMPTY
    long = "n" * 255
    write(m.path(long), b"long name")
    assert read(m.path(long)) == b"long name"
    with pytest.raises(OSError) as e:
        write(m.path("n" * 256), b"")
    assert e.value.errno == errno.ENAMETOOLONG


def test_xattrs(kfs):
    m = kfs()
    write(m.path("f"), b"x")
    os.setxattr(m.path("f"), "user.kind", b"kernel")
    assert os.getxattr(m.path("f"), "user.kind") == b"kernel"
    assert "user.kind" in os.listxattr(m.path("f"))
    os.removexattr(m.path("f"), "user.kind")
    assert "user.kind" not in os.listxattr(m.path("f"))


def test_fallocate(kfs):
    m = kfs()
    fd = os.open(m.path("f"), os.O_CREAT | os.O_RDWR, 0o644)
    os.posix_fallocate(fd, 0, 1 << 20)
    assert os.fstat(fd).st_size == 1 << 20
    os.close(fd)
    assert os.stat(m.path("f")).st_blocks * 512 >= 1 << 20


def test_statfs_shows_the_limit(kfs):
    m = kfs({"max_size": "64M"})
    s = os.statvfs(m.mnt)
    assert s.f_blocks * s.f_frsize == 64 << 20
    assert s.f_namemax == 255


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")
def test_allow_other_files_belong_to_their_creator(kfs):
    m = kfs({"allow_other": True, "default_permissions": True})
    os.chmod(m.mnt, 0o1777)
    u = ensure_user("kcfs-user1")
    subprocess.run(["runuser", "-u", u.pw_name, "--", "sh", "-c",
                    f"echo hi > {m.path('mine')} && mkdir {m.path('mydir')} && ln -s x {m.path('mylink')}"],
                   check=True)
    for n in ("mine", "mydir", "mylink"):
        st = os.lstat(m.path(n))
        assert st.st_uid == u.pw_uid, n
        assert os.lstat(os.path.join(m.backing, n)).st_uid == u.pw_uid


def test_large_directory_listing_resumes_across_requests(kfs):
    # 3,000 long names need many READDIR replies; each one resumes at the kernel's offset.
    m = kfs()
    os.makedirs(m.path("big"))
    names = {f"{i:05d}-" + "x" * 120 for i in range(3000)}
    for n in names:
        open(m.path("big", n), "wb").close()
    assert set(os.listdir(m.path("big"))) == names
    for n in sorted(names)[::2]:
        os.unlink(m.path("big", n))
    assert set(os.listdir(m.path("big"))) == set(sorted(names)[1::2])
    kinds = {e.name: e.is_file() for e in os.scandir(m.path("big"))}
    assert len(kinds) == 1500 and all(kinds.values())


def test_flock_is_one_domain_with_the_backing_file(kfs):
    # The daemon repairs runtimes' bookkeeping under their own flock: a lock on the backing file and a lock
    # through the mount must exclude each other.
    m = kfs()
    write(m.path("config.file"), b"\0" * 8)
    bfd = os.open(os.path.join(m.backing, "config.file"), os.O_RDWR)
    fcntl.flock(bfd, fcntl.LOCK_EX)
    fd = os.open(m.path("config.file"), os.O_RDWR)
    with pytest.raises(BlockingIOError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.flock(bfd, fcntl.LOCK_UN)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with pytest.raises(BlockingIOError):
        fcntl.flock(bfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.flock(fd, fcntl.LOCK_UN)  # an explicit unlock is synchronous
    fcntl.flock(bfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.flock(bfd, fcntl.LOCK_UN)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.close(fd)  # releases the lock through FUSE's asynchronous RELEASE: a moment after close() returns

    def free():
        try:
            fcntl.flock(bfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
    wait_for(free, timeout=5, what="the lock to be released after close")
    os.close(bfd)


def _made_with_umask(path_file, path_dir, mask):
    old = os.umask(mask)
    try:
        fd = os.open(path_file, os.O_CREAT | os.O_WRONLY, 0o777)
        os.close(fd)
        os.mkdir(path_dir, 0o777)
        os.mknod(path_file + ".fifo", 0o666 | stat.S_IFIFO)
    finally:
        os.umask(old)
    return (stat.S_IMODE(os.stat(path_file).st_mode), stat.S_IMODE(os.stat(path_dir).st_mode),
            stat.S_IMODE(os.stat(path_file + ".fifo").st_mode))


def test_creation_honours_the_callers_mode_and_umask_exactly(kfs):
    m = kfs()
    # umask 0: everything the caller asked for; 002: a group-shared cache; 077: private.
    assert _made_with_umask(m.path("f0"), m.path("d0"), 0) == (0o777, 0o777, 0o666)
    assert _made_with_umask(m.path("f2"), m.path("d2"), 0o002) == (0o775, 0o775, 0o664)
    assert _made_with_umask(m.path("f7"), m.path("d7"), 0o077) == (0o700, 0o700, 0o600)
    # The backing files carry the same modes (what a remount or a rebuild shows).
    assert stat.S_IMODE(os.stat(os.path.join(m.backing, "f2")).st_mode) == 0o775
    assert stat.S_IMODE(os.stat(os.path.join(m.backing, "d2")).st_mode) == 0o775


def test_o_direct_writes_and_reads_of_any_size(kfs):
    m = kfs({"max_size": "64M"}, fs="ext4")  # tmpfs takes unaligned O_DIRECT; a disk does not
    for bs in ("4K", "64K", "1M"):
        p = subprocess.run(["dd", "if=/dev/urandom", f"of={m.path('d' + bs)}", f"bs={bs}", "count=4",
                            "oflag=direct"], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        p = subprocess.run(["dd", f"if={m.path('d' + bs)}", "of=/dev/null", f"bs={bs}", "iflag=direct"],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    n = {"4K": 4 << 12, "64K": 4 << 16, "1M": 4 << 20}
    for bs, size in n.items():
        assert os.stat(m.path("d" + bs)).st_size == size
        assert read(m.path("d" + bs)) == read(os.path.join(m.backing, "d" + bs))


def test_times_of_a_symlink_itself_and_copies_of_trees_with_symlinks(kfs, tmp_path):
    m = kfs()
    os.symlink("target-that-does-not-exist", m.path("l"))
    os.utime(m.path("l"), ns=(1_000_000_000, 2_000_000_000), follow_symlinks=False)
    assert os.lstat(m.path("l")).st_mtime_ns == 2_000_000_000
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    (src / "x" / "f").write_bytes(b"data")
    os.symlink("f", src / "x" / "l")
    os.symlink("../x", src / "x" / "up")
    os.utime(src / "x" / "l", ns=(978_307_200_000_000_000, 978_307_200_000_000_000), follow_symlinks=False)
    p = subprocess.run(["rsync", "-a", f"{src}/", m.path("rs") + "/"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    os.mkdir(m.path("tar"))
    p = subprocess.run(f"tar -C {src} -cf - . | tar -C {m.path('tar')} -xf -", shell=True, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    for d in ("rs", "tar"):
        assert os.readlink(m.path(d, "x", "l")) == "f"
        assert os.lstat(m.path(d, "x", "l")).st_mtime == 978_307_200  # 2001-01-01: copied, not made now
