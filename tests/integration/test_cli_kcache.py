"""The kcache command and the user.kcachefs.* attributes it uses, through a real mount."""
import json
import os
import subprocess

import pytest

from conftest import ROOT, backing_files, ensure_user

K = 1024


def kcache_bin():
    return os.environ.get("KCACHE_BIN") or os.path.join(ROOT, "build", "kcache")


def kcache(*args, check=True, user=None):
    cmd = [kcache_bin(), *args]
    if user:
        cmd = ["runuser", "-u", user, "--"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if check:
        assert p.returncode == 0, p.stderr
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
    assert p.returncode == 1 and "invalid duration" in p.stderr


def test_getfattr_and_setfattr(kfs):
    m = kfs()
    fill(m, ["k"])
    open(m.path("k"), "rb").read()
    out = subprocess.run(["getfattr", "-d", "-m", "user.kcachefs", m.path("k")], capture_output=True, text=True,
                         check=True).stdout
    for name in ("atime", "opens", "pinned"):
        assert f"user.kcachefs.{name}=" in out
    assert int(os.getxattr(m.path("k"), "user.kcachefs.atime_ns")) == os.stat(m.path("k")).st_atime_ns
    assert os.getxattr(m.path("k"), "user.kcachefs.opens") == b"2"
    subprocess.run(["setfattr", "-n", "user.kcachefs.pinned", "-v", "1", m.path("k")], check=True)
    assert os.getxattr(m.path("k"), "user.kcachefs.pinned") == b"1"
    root = subprocess.run(["getfattr", "-d", "-m", "user.kcachefs", m.mnt], capture_output=True, text=True,
                          check=True).stdout
    assert "user.kcachefs.used_bytes=" in root and "user.kcachefs.max_bytes=" in root
    # Ordinary attributes still reach the backing file.
    os.setxattr(m.path("k"), "user.other", b"v")
    assert os.getxattr(os.path.join(m.backing, "k"), "user.other") == b"v"
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
    assert os.listdir(m.mnt) == ["x"]
    assert os.getxattr(m.path("x"), "user.kcachefs.pinned") == b"0"


def on_a_terminal(cmd):
    """Runs cmd with its stdout and stderr on a pseudo-terminal; returns (status, what it wrote)."""
    import pty
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(cmd[0], cmd)
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
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


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
    rc, out = on_a_terminal([kc, "evict", m.mnt, "--to", "0"])
    assert rc == 0 and "kcache: evicting" in out and "evicted" in out, out
    for d in range(30):  # again, on a pipe
        with open(m.path(f"d{d}", "again"), "wb") as f:
            f.write(b"z")
    piped = subprocess.run([kc, "verify", m.mnt], capture_output=True, text=True)
    assert piped.returncode == 0 and "kcache:" not in piped.stderr + piped.stdout, piped
