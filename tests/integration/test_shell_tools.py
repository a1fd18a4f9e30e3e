"""ls -lu, find -amin, du, df, stat, rm, mv, cp -r, tar and rsync through the mount, with the accounting
checked after each: du of the mount, df's used and the index must agree with the backing directory."""
import os
import subprocess
import time

from conftest import backing_files, wait_for


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=True, capture_output=True, text=True, check=True, **kw).stdout


def exact(m):
    truth = sum(backing_files(m.backing).values())
    du = int(sh(f"du -sB1 {m.mnt}").split()[0])
    assert du == truth, (du, truth)
    assert m.used() == truth
    assert m.df_used() == truth  # below the limit, df's clamp does not apply
    return truth


def tree(m, root="src"):
    for i in range(5):
        d = m.path(root, f"d{i % 2}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"k{i}.bin"), "wb") as f:
            f.write(os.urandom(3000 + 5000 * i))


def test_every_tool_keeps_the_accounting_exact(kfs, tmp_path):
    m = kfs({"max_size": "64M"})
    tree(m)
    exact(m)
    # ls -lu and find -amin see the logged access time.
    time.sleep(0.01)
    open(m.path("src", "d0", "k0.bin"), "rb").read()
    # once the daemon has had the RELEASE that close() queued (fs/ops-io.c, ATIME)
    wait_for(lambda: sh(f"ls -1tu {m.path('src', 'd0')}").split()[0] == "k0.bin", timeout=5, what="ls -lu")
    recent = sh(f"find {m.mnt} -type f -amin -1").split()
    assert len(recent) == 5
    st = sh(f"stat -c '%s %X' {m.path('src', 'd0', 'k0.bin')}").split()
    assert st[0] == "3000"
    # cp -r, mv, rm
    sh(f"cp -r {m.path('src')} {m.path('copy')}")
    assert exact(m) > 0
    sh(f"mv {m.path('copy')} {m.path('moved')}")
    exact(m)
    sh(f"mv {m.path('moved', 'd0', 'k0.bin')} {m.path('src', 'renamed.bin')}")
    exact(m)
    sh(f"rm -rf {m.path('moved')}")
    exact(m)
    # tar out and back in
    sh(f"tar -C {m.mnt} -cf {tmp_path}/t.tar src")
    sh(f"mkdir {m.path('untar')} && tar -C {m.path('untar')} -xf {tmp_path}/t.tar")
    exact(m)
    assert sh(f"diff -r {m.path('src')} {m.path('untar', 'src')} && echo same").strip() == "same"
    # rsync in (temp file + rename, as it does) and out
    src = tmp_path / "in"
    src.mkdir()
    for i in range(4):
        (src / f"r{i}").write_bytes(os.urandom(7000 * (i + 1)))
    sh(f"rsync -a {src}/ {m.path('rs')}/")
    exact(m)
    sh(f"rsync -a {m.path('rs')}/ {tmp_path}/out/")
    assert sh(f"diff -r {src} {tmp_path}/out && echo same").strip() == "same"
    # df shows the limit
    size = int(sh(f"df -B1 --output=size {m.mnt}").split()[1])
    assert size == 64 << 20
    m.stop()
    assert m.index_rows() == backing_files(m.backing)
