"""The kcache command and the user.kcachefs.* attributes it uses, through a real mount."""
import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from conftest import backing_files, ensure_user, kcache_bin, proc_state, wait_for

K = 1024


def kcache(*args, check=True, user=None, timeout=60):
    cmd = [kcache_bin(), *args]
    if user:
        cmd = ["runuser", "-u", user, "--"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def fill(m, names, size=8 * K):
    for n in names:
        os.makedirs(os.path.dirname(m.path(n)) or m.mnt, exist_ok=True)
        with open(m.path(n), "wb") as f:
            f.write(b"k" * size)


def test_stats_json_prometheus_and_human(kfs):
    m = kfs({"max_size": "4M"})
    fill(m, ["a/1", "a/2", "b/3"])
    s = json.loads(kcache("stats", "--json", m.mnt).stdout)
    for key in ("max_bytes", "used_bytes", "files", "evicted_files", "evicted_bytes", "opens", "rebuilds"):
        assert key in s
    assert s["max_bytes"] == 4 << 20 and s["files"] == 3 and s["used_bytes"] == 3 * 8 * K
    assert s["users"] == [{"uid": 0, "files": 3, "bytes": 3 * 8 * K}]
    prom = kcache("stats", "--prometheus", m.mnt).stdout
    assert f'kcachefs_used_bytes{{mount="{m.mnt}"}} {3 * 8 * K}' in prom
    assert "# TYPE kcachefs_evicted_files_total counter" in prom
    human = kcache("stats", m.mnt).stdout
    assert "4.0 MiB" in human and "24.0 KiB" in human


def test_ls_orders_and_filters(kfs):
    m = kfs()
    fill(m, ["d/x", "d/y", "e/z"])
    for n in ["d/y", "e/z", "d/x"]:  # access order: y, z, x
        open(m.path(n), "rb").read()
    rows = [l.split()[-1] for l in kcache("ls", m.mnt).stdout.splitlines()[1:]]
    assert rows == ["d/y", "e/z", "d/x"]
    rows = [l.split()[-1] for l in kcache("ls", m.mnt, "--mru", "-n", "2").stdout.splitlines()[1:]]
    assert rows == ["d/x", "e/z"]
    rows = [l.split()[-1] for l in kcache("ls", m.mnt, "d").stdout.splitlines()[1:]]
    assert rows == ["d/y", "d/x"]


def test_pin_evict_and_verify(kfs):
    m = kfs({"max_size": "4M"})
    fill(m, [f"f{i}" for i in range(6)])
    kcache("pin", m.path("f0"))
    assert os.getxattr(m.path("f0"), "user.kcachefs.pinned") == b"1"
    out = kcache("evict", m.mnt, "--to", "0").stdout
    assert "evicted 5 files" in out
    assert os.listdir(m.mnt) == ["f0"]
    kcache("unpin", m.path("f0"))
    assert os.getxattr(m.path("f0"), "user.kcachefs.pinned") == b"0"
    # A single file, and a file that is open (protected).
    fill(m, ["g", "h"])
    with open(m.path("h"), "rb"):
        p = kcache("evict", m.path("h"), check=False)
        assert p.returncode == 1 and "open" in p.stderr
    kcache("evict", m.path("g"))
    assert sorted(os.listdir(m.mnt)) == ["f0", "h"]
    # --older-than: everything accessed before now.
    kcache("evict", m.mnt, "--older-than", "0s")
    assert os.listdir(m.mnt) == []
    # verify: a file added behind the daemon's back is a difference; --repair fixes it.
    with open(os.path.join(m.backing, "sneaky"), "wb") as f:
        f.write(b"s" * 5000)
    p = kcache("verify", m.mnt, check=False)
    assert p.returncode == 1 and "not in the index:   sneaky" in p.stdout
    assert "repaired" in kcache("verify", "--repair", m.mnt).stdout
    assert "matches" in kcache("verify", m.mnt).stdout
    assert json.loads(kcache("stats", "--json", m.mnt).stdout)["used_bytes"] == backing_files(m.backing)["sneaky"]


def test_env_points_runtimes_at_subdirectories(kfs):
    m = kfs()
    out = kcache("env", m.mnt).stdout
    for var in ("NEO_CACHE_DIR", "SYCL_CACHE_PERSISTENT=1", "POCL_CACHE_DIR", "CUDA_CACHE_PATH", "TRITON_CACHE_DIR",
                "JAX_COMPILATION_CACHE_DIR", "KCACHE_DIR", "NEO_CACHE_MAX_SIZE=0", "MESA_SHADER_CACHE_DIR",
                "NUMBA_CACHE_DIR", "CCACHE_DIR", "CCACHE_MAXSIZE=0", "TORCHINDUCTOR_CACHE_DIR", "CUPY_CACHE_DIR",
                "TORCH_EXTENSIONS_DIR"):
        assert var in out
    assert "XDG_CACHE_HOME" not in out  # it moves every program's cache: only when asked for by name
    for d in ("neo", "sycl", "pocl", "cuda", "triton", "jax", "kcache", "mesa", "numba", "ccache", "inductor",
              "cupy", "torch-extensions"):
        assert os.path.isdir(m.path(d))
    assert kcache("env", m.mnt, "pyopencl").stdout.strip() == f"export XDG_CACHE_HOME='{m.path('xdg')}'"
    bad = kcache("env", m.mnt, "nosuch", check=False)
    assert bad.returncode != 0 and "numba" in bad.stderr  # the error lists the runtimes it knows
    env = subprocess.run(["bash", "-c", f'eval "$({kcache_bin()} env {m.mnt} pocl)"; echo $POCL_CACHE_DIR'],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert env == m.path("pocl")


def test_clear_errors(kfs, tmp_path):
    m = kfs()
    p = kcache("stats", str(tmp_path), check=False)
    assert p.returncode == 1 and "not the root of a kcachefs mount" in p.stderr
    p = kcache("frobnicate", check=False)
    assert p.returncode == 2
    p = kcache("evict", m.mnt, "--older-than", "soon", check=False)
    assert p.returncode == 2 and "invalid duration" in p.stderr  # bad usage (kcache(1), EXIT STATUS)


def test_getfattr_and_setfattr(kfs):
    m = kfs()
    fill(m, ["k"])
    open(m.path("k"), "rb").read()
    out = subprocess.run(["getfattr", "-d", "-m", "user.kcachefs", m.path("k")], capture_output=True, text=True,
                         check=True).stdout
    for name in ("atime", "opens", "pinned"):
        assert f"user.kcachefs.{name}=" in out
    # once the daemon has had the RELEASE that close() queued (fs/ops-io.c, ATIME)
    wait_for(lambda: int(os.getxattr(m.path("k"), "user.kcachefs.atime_ns")) == os.stat(m.path("k")).st_atime_ns,
             timeout=5, what="the logged atime in stat")
    assert os.getxattr(m.path("k"), "user.kcachefs.opens") == b"2"
    subprocess.run(["setfattr", "-n", "user.kcachefs.pinned", "-v", "1", m.path("k")], check=True)
    assert os.getxattr(m.path("k"), "user.kcachefs.pinned") == b"1"
    root = subprocess.run(["getfattr", "-d", "-m", "user.kcachefs", m.mnt], capture_output=True, text=True,
                          check=True).stdout
    assert "user.kcachefs.used_bytes=" in root and "user.kcachefs.max_bytes=" in root
    # Ordinary attributes still reach the backing file.
    os.setxattr(m.path("k"), "user.other", b"v")
    assert os.getxattr(os.path.join(m.backing, "k"), "user.other") == b"v"
    # Of ours, only the pin reaches it, which the daemon keeps there itself (a rebuild restores it); none
    # once unpinned.
    assert [n for n in os.listxattr(os.path.join(m.backing, "k")) if n.startswith("user.kcachefs")] == \
        ["user.kcachefs.pinned"]
    subprocess.run(["setfattr", "-x", "user.kcachefs.pinned", m.path("k")], check=True)
    assert not any(n.startswith("user.kcachefs") for n in os.listxattr(os.path.join(m.backing, "k")))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")
def test_only_the_owner_or_root_may_act(kfs):
    m = kfs({"allow_other": True, "default_permissions": True})
    os.chmod(m.mnt, 0o1777)
    ensure_user("kcfs-user2")
    fill(m, ["x"])
    os.chmod(m.path("x"), 0o644)
    # Reading works for everyone, never an action.
    assert kcache("stats", m.mnt, user="kcfs-user2").returncode == 0
    p = kcache("evict", m.mnt, "--to", "0", check=False, user="kcfs-user2")
    assert p.returncode == 1 and "owner" in p.stderr
    p = kcache("pin", m.path("x"), check=False, user="kcfs-user2")
    assert p.returncode == 1
    assert sorted(os.listdir(m.mnt)) == ["users", "x"]  # users/: the daemon's, made at a shared mount
    assert os.getxattr(m.path("x"), "user.kcachefs.pinned") == b"0"


def on_a_terminal(cmd, while_running=None):
    """Runs cmd with its stdout and stderr on a pseudo-terminal; returns (status, what it wrote).
    while_running(pid), if given, runs in a thread of its own meanwhile."""
    import pty
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(cmd[0], cmd)
    t = threading.Thread(target=while_running, args=(pid,)) if while_running else None
    if t:
        t.start()
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(fd)
    if t:
        t.join()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def wchans(pid):
    """Where each thread of pid sleeps in the kernel (/proc/PID/task/TID/wchan); [] once it has ended."""
    try:
        if proc_state(pid) in ("Z", "X"):
            return []  # ended, not yet waited for
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []
    w = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                w.append(f.read())
        except FileNotFoundError:
            pass
    return w


def hold_daemon_while_waited_on(m, held):
    """A while_running for on_a_terminal: once the command's request waits on the daemon while its other
    thread sleeps between two looks at the progress (kc_set_watched), stops the daemon for half a second,
    so that the operation lasts past a look whatever this machine's speed. Appends True to held if so."""
    def run(pid):
        while True:
            w = wchans(pid)
            if not w:
                return  # the command ended first
            if "request_wait_answer" in w and any("nanosleep" in x for x in w):
                os.kill(m.pid(), signal.SIGSTOP)
                try:
                    time.sleep(0.5)
                finally:
                    os.kill(m.pid(), signal.SIGCONT)
                held.append(True)
                return
            time.sleep(0.0002)
    return run


def test_long_operations_show_progress_on_a_terminal_and_not_on_a_pipe(kfs):
    """kcache verify (its scan of the tree), verify --repair (the daemon's rescan) and evict --to (many
    files) say how far they are on a terminal, and print only their result on a pipe."""
    m = kfs({"max_size": "1G"}, tmpfs_size="512m")
    for d in range(30):
        os.mkdir(m.path(f"d{d}"))
        for i in range(1000):
            with open(m.path(f"d{d}", f"f{i}"), "wb") as f:
                f.write(b"x")
    kc = kcache_bin()
    rc, out = on_a_terminal([kc, "verify", m.mnt])
    assert rc == 0 and "kcache: scanning" in out and "matches" in out, out
    rc, out = on_a_terminal([kc, "verify", "--repair", m.mnt])
    assert rc == 0, out  # no difference: nothing to repair, and no progress either
    with open(os.path.join(m.backing, "behind-its-back"), "wb") as f:  # a difference to repair
        f.write(b"y")
    rc, out = on_a_terminal([kc, "verify", "--repair", m.mnt])
    assert rc == 0 and "kcache: repairing" in out and "repaired" in out, out
    # The progress shows from the first look, 200 ms in: an eviction of these 30,001 files once ended
    # sooner. Held past it, the line must show.
    held = []
    rc, out = on_a_terminal([kc, "evict", m.mnt, "--to", "0"], hold_daemon_while_waited_on(m, held))
    assert held, "the eviction ended before it could be held"
    assert rc == 0 and "kcache: evicting" in out and "evicted" in out, out
    for d in range(30):  # again, on a pipe
        with open(m.path(f"d{d}", "again"), "wb") as f:
            f.write(b"z")
    piped = subprocess.run([kc, "verify", m.mnt], capture_output=True, text=True)
    assert piped.returncode == 0 and "kcache:" not in piped.stderr + piped.stdout, piped


# Names a user's program may make: a newline (which must not forge a row), a terminal escape, quotes, a
# backslash, a tab, bytes that are not UTF-8, and ordinary non-ASCII.
ODD_NAMES = [b"new\nline", b"esc\x1b[31mred", b'quo"te', b"it's", b"back\\slash", b"tab\there", b"bad\xff\xfe.bin",
             b"c1\xc2\x9bx", b"caf\xc3\xa9", b"plain-name_1.bin"]

ROW = re.compile(rb"^ *\S+ \S+  \S+ \S+  +\d+  (pin|   )  (.*)$")


def shell_words(words):
    """The bytes each shell word stands for, as bash reads it."""
    script = b"printf '%s\\0' " + b" ".join(words)
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
    return out.split(b"\0")[:-1]


def test_odd_names_in_ls_plain_and_json(kfs):
    m = kfs()
    for n in ODD_NAMES:
        with open(os.path.join(os.fsencode(m.mnt), n), "wb") as f:
            f.write(b"x" * 100)
    for args in ([], ["--mru"]):
        out = subprocess.run([kcache_bin(), "ls", m.mnt, *args], capture_output=True, timeout=60).stdout
        # No raw control character, and one row per file (after the header).
        assert not [c for c in out if (c < 0x20 and c != 0x0a) or 0x7f <= c <= 0x9f], out
        assert b"\xc2\x9b" not in out, out  # the C1 control CSI, as UTF-8
        rows = out.split(b"\n")[1:-1]
        assert len(rows) == len(ODD_NAMES), out
        paths = [ROW.match(r).group(2) for r in rows]
        assert sorted(shell_words(paths)) == sorted(ODD_NAMES), paths  # bash gives every name back
    assert b"plain-name_1.bin\n" in out and b"caf\xc3\xa9\n" in out  # needs no quoting, none added
    # JSON: parses, and os.fsencode of each path gives the name's bytes back.
    out = subprocess.run([kcache_bin(), "ls", "--json", m.mnt], capture_output=True, timeout=60, check=True).stdout
    assert not [c for c in out if c < 0x20 and c != 0x0a], out
    out.decode("utf-8")  # strictly UTF-8: a byte that is not is escaped, never written
    rows = json.loads(out)
    assert sorted(os.fsencode(r["path"]) for r in rows) == sorted(ODD_NAMES)
    assert all(r["bytes"] > 0 and r["pinned"] is False for r in rows)
    assert json.loads(subprocess.run([kcache_bin(), "ls", "--json", m.mnt, "nosuch"], capture_output=True,
                                     check=True).stdout) == []


PROM_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:\\[\\"n]|[^"\\\n])*",?)*)\} '
                       r'(\d+)$')


def prom_unescape(v):
    return re.sub(r'\\([\\"n])', lambda x: "\n" if x.group(1) == "n" else x.group(1), v)


def test_odd_mount_path_in_stats_json_prometheus_and_plain(kfs):
    m = kfs(start=False)
    odd = os.path.join(os.path.dirname(m.mnt), 'mnt "q\\b\x1bx\nl')
    os.makedirs(odd)
    m.mnt = odd  # the fixture unmounts it
    m.start()
    fill(m, ["a", "b"])
    s = json.loads(kcache("stats", "--json", m.mnt).stdout)
    assert s["mount"] == odd and s["files"] == 2
    prom = kcache("stats", "--prometheus", m.mnt).stdout
    seen = 0
    for line in prom.splitlines():
        if line.startswith("#"):
            continue
        g = PROM_LINE.match(line)
        assert g, line
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:\\[\\"n]|[^"\\\n])*)"', g.group(2)))
        assert prom_unescape(labels["mount"]) == odd.replace("\x1b", "\ufffd")  # controls: U+FFFD (kcache(1))
        seen += 1
    assert seen > 20
    human = subprocess.run([kcache_bin(), "stats", m.mnt], capture_output=True, check=True).stdout
    assert b"\x1b" not in human
    line = [l for l in human.split(b"\n") if l.startswith(b"mount ")][0]
    assert shell_words([line.split(None, 1)[1]]) == [os.fsencode(odd)]


def deep_dirs(top, levels, name_len=240):
    """Makes LEVELS nested directories under TOP with dir_fd walks (the path outgrows PATH_MAX, which no
    path string can reach); returns an fd on the deepest and the path's length."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    length = len(top)
    for i in range(levels):
        name = f"{i:03d}" + "d" * (name_len - 3)
        os.mkdir(name, dir_fd=fd)
        nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
        length += 1 + len(name)
    return fd, length


def test_verify_a_tree_deeper_than_path_max(kfs):
    m = kfs()
    fill(m, ["shallow"])
    fd, length = deep_dirs(m.mnt, 20)
    assert length > 4096 + 512
    try:
        wfd = os.open("deep-file", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(wfd, b"k" * 5000)
        os.close(wfd)
    finally:
        os.close(fd)
    p = kcache("verify", m.mnt, check=False)
    assert p.returncode == 0 and "matches" in p.stdout, p.stdout + p.stderr
    # A file added behind the daemon's back at that depth is found, reported by its whole path, repaired.
    bfd = os.open(m.backing, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(20):
            name = [n for n in os.listdir(bfd) if n[:3].isdigit()][0]
            nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=bfd)
            os.close(bfd)
            bfd = nfd
        wfd = os.open("sneaky", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=bfd)
        os.write(wfd, b"s" * 3000)
        os.close(wfd)
    finally:
        os.close(bfd)
    p = kcache("verify", m.mnt, check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    line = [l for l in p.stdout.splitlines() if l.startswith("not in the index:")]
    assert len(line) == 1 and line[0].split()[4].endswith("/sneaky") and len(line[0].split()[4]) > 4096, p.stdout
    assert "repaired" in kcache("verify", "--repair", m.mnt).stdout
    assert "matches" in kcache("verify", m.mnt).stdout


@pytest.mark.parametrize("how", ["delete", "corrupt", "rebuild"])
def test_pins_survive_a_rebuild_of_the_index(kfs, how):
    m = kfs({"max_size": "4M"})
    fill(m, ["keep", "drop", "d/keep2", "was-pinned"])
    for n in ("keep", "d/keep2", "was-pinned"):
        kcache("pin", m.path(n))
    kcache("unpin", m.path("was-pinned"))
    before = json.loads(kcache("stats", "--json", m.mnt).stdout)["rebuilds"]
    m.stop()
    if how == "delete":
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(m.index_path + suffix):
                os.unlink(m.index_path + suffix)
    elif how == "corrupt":
        with open(m.index_path, "r+b") as f:
            f.write(b"this is not a database" * 200)
    else:  # the operator's -o rebuild, after the index lost its flags (an older copy, say)
        import sqlite3
        db = sqlite3.connect(m.index_path)
        db.execute("UPDATE files SET pinned = 0")
        db.commit()
        db.close()
        m.opts["rebuild"] = True
    if how != "rebuild":
        before = 0  # a new index counts from nothing
    m.start()
    assert json.loads(kcache("stats", "--json", m.mnt).stdout)["rebuilds"] > before
    for n, want in (("keep", b"1"), ("d/keep2", b"1"), ("drop", b"0"), ("was-pinned", b"0")):
        assert os.getxattr(m.path(n), "user.kcachefs.pinned") == want, n
    kcache("evict", m.mnt, "--to", "0")
    assert sorted(os.listdir(m.mnt)) == ["d", "keep"] and os.listdir(m.path("d")) == ["keep2"]
    # The pins show in the listing of every file; the eviction order (ls, --lru) leaves them out, since
    # they are never evicted.
    assert "pin" in kcache("ls", "--mru", m.mnt).stdout
    lru = kcache("ls", m.mnt).stdout
    assert "pin" not in lru and "keep" not in lru, lru


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")
def test_a_user_cannot_forge_a_pin_through_the_mount(kfs):
    """The pin's attribute on the backing file is the daemon's: a user who may not pin cannot write it
    through the mount, on another's file or their own, so no rebuild can find a pin there."""
    m = kfs({"allow_other": True, "default_permissions": True})
    os.chmod(m.mnt, 0o1777)
    u = ensure_user("kcfs-user2")
    fill(m, ["roots"])
    os.chmod(m.path("roots"), 0o666)
    subprocess.run(["runuser", "-u", u.pw_name, "--", "sh", "-c", f"echo x > {m.path('mine')}"], check=True)
    for n in ("roots", "mine"):
        p = subprocess.run(["runuser", "-u", u.pw_name, "--", "setfattr", "-n", "user.kcachefs.pinned", "-v", "1",
                            m.path(n)], capture_output=True, text=True)
        assert p.returncode != 0 and "not permitted" in p.stderr, (n, p.stderr)
        assert "user.kcachefs.pinned" not in os.listxattr(os.path.join(m.backing, n))
    m.stop()
    os.unlink(m.index_path)
    m.start()
    assert os.getxattr(m.path("mine"), "user.kcachefs.pinned") == b"0"
    assert os.getxattr(m.path("roots"), "user.kcachefs.pinned") == b"0"


def test_what_is_never_evicted_is_shown_apart_and_not_listed_to_go(kfs):
    """The issue's Mesa case: Mesa's index (every GL process maps it) is 1.5 MiB of a 4 MiB cache and was
    listed among the next to go. kcache stats counts the bytes never evicted (kept), --json and
    --prometheus too; ls --lru leaves them out, --mru shows every file; kcache evict --to 0 leaves them."""
    m = kfs({"max_size": "4M", "grace_ms": "0"})
    os.makedirs(m.path("mesa/mesa_shader_cache/ab"))
    with open(m.path("mesa/mesa_shader_cache/index"), "wb") as f:
        f.write(b"i" * (1536 * K))
    for i in range(4):
        with open(m.path(f"mesa/mesa_shader_cache/ab/entry{i}"), "wb") as f:
            f.write(b"e" * (64 * K))
    os.makedirs(m.path("neo"))
    with open(m.path("neo/config.file"), "wb") as f:
        f.write(b"1234")
    s = json.loads(kcache("stats", "--json", m.mnt).stdout)
    kept_bytes = 1536 * K + 4096  # config.file: one block on tmpfs
    assert s["kept_files"] == 2 and s["kept_bytes"] == kept_bytes, s
    plain = kcache("stats", m.mnt).stdout
    assert re.search(r"^kept +2 files \(1\.5 MiB\) never evicted", plain, re.M), plain
    prom = kcache("stats", "--prometheus", m.mnt).stdout
    assert re.search(r"^kcachefs_kept_bytes\{[^}]*\} %d$" % kept_bytes, prom, re.M), prom
    lru = kcache("ls", "--lru", m.mnt).stdout
    assert "entry0" in lru and "index" not in lru and "config.file" not in lru, lru
    rows = json.loads(kcache("ls", "--json", m.mnt).stdout)
    assert sorted(r["path"] for r in rows) == [f"mesa/mesa_shader_cache/ab/entry{i}" for i in range(4)], rows
    assert "mesa/mesa_shader_cache/index" in kcache("ls", "--mru", m.mnt).stdout
    kcache("evict", m.mnt, "--to", "0")
    assert os.path.getsize(m.path("mesa/mesa_shader_cache/index")) == 1536 * K
    assert os.path.exists(m.path("neo/config.file")) and not os.path.exists(m.path("mesa/mesa_shader_cache/ab/entry0"))
