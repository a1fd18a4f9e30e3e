"""A shared cache on an HPC node: one mount (allow_other,default_permissions, a sticky root like /tmp),
several users created by the test. Private entries stay private, nobody deletes, replaces or renames
another user's entries, usage is accounted per user, and actions need the mount owner's rights."""
import errno
import json
import os
import subprocess

import pytest

from conftest import ROOT, ensure_user

KCACHE = os.environ.get("KCACHE_BIN") or os.path.join(ROOT, "build", "kcache")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")


def as_user(u, code, *args):
    """Runs python CODE as user U; returns the errno it reports (0: success)."""
    prog = ("import errno, os, sys\n"
            "try:\n" + "".join("    " + line + "\n" for line in code.split("\n")) +
            "    print(0)\n"
            "except OSError as e:\n"
            "    print(e.errno)\n")
    p = subprocess.run(["runuser", "-u", u.pw_name, "--", "/usr/bin/python3", "-c", prog, *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return int(p.stdout.strip())


@pytest.fixture
def shared(kfs):
    m = kfs({"allow_other": True, "default_permissions": True, "max_size": "64M"})
    os.chmod(m.mnt, 0o1777)
    return m, ensure_user("kcfs-alice"), ensure_user("kcfs-bob")


def test_private_entries_stay_private(shared):
    m, alice, bob = shared
    p = m.path("alice-private")
    assert as_user(alice, "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600); os.write(fd, b'secret' * 100)", p) == 0
    assert os.stat(p).st_uid == alice.pw_uid
    assert as_user(bob, "open(sys.argv[1], 'rb').read()", p) == errno.EACCES
    assert as_user(bob, "open(sys.argv[1], 'ab').write(b'x')", p) == errno.EACCES
    assert as_user(alice, "assert open(sys.argv[1], 'rb').read() == b'secret' * 100", p) == 0


def test_sticky_directory_nobody_removes_or_replaces_another_users_entry(shared):
    m, alice, bob = shared
    entry = m.path("kernel.bin")
    assert as_user(alice, "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644); os.write(fd, b'A' * 4096)",
                   entry) == 0
    assert as_user(bob, "open(sys.argv[1], 'rb').read()", entry) == 0  # readable: it is 0644
    assert as_user(bob, "os.unlink(sys.argv[1])", entry) == errno.EPERM
    forged = m.path("bob-forged")
    assert as_user(bob, "open(sys.argv[1], 'wb').write(b'B' * 4096)", forged) == 0
    assert as_user(bob, "os.rename(sys.argv[1], sys.argv[2])", forged, entry) == errno.EPERM  # rename over
    assert as_user(bob, "os.rename(sys.argv[1], sys.argv[2])", entry, m.path("stolen")) == errno.EPERM
    assert as_user(bob, "open(sys.argv[1], 'r+b').write(b'B')", entry) == errno.EACCES
    assert as_user(bob, "os.truncate(sys.argv[1], 0)", entry) == errno.EACCES
    assert open(entry, "rb").read() == b"A" * 4096 and os.stat(entry).st_uid == alice.pw_uid
    # The owner herself may.
    assert as_user(alice, "os.rename(sys.argv[1], sys.argv[2])", entry, m.path("renamed")) == 0
    assert as_user(alice, "os.unlink(sys.argv[1])", m.path("renamed")) == 0


def test_usage_is_accounted_per_user(shared):
    m, alice, bob = shared
    for u, n, size in ((alice, 3, 40000), (bob, 5, 9000)):
        for i in range(n):
            assert as_user(u, "open(sys.argv[1], 'wb').write(b'z' * int(sys.argv[2]))",
                           m.path(f"{u.pw_name}-{i}"), str(size)) == 0
    st = json.loads(subprocess.run([KCACHE, "stats", m.mnt, "--json"], capture_output=True, text=True,
                                   check=True).stdout)
    users = {u["uid"]: u for u in st["users"]}
    assert users[alice.pw_uid]["files"] == 3 and users[bob.pw_uid]["files"] == 5
    # Allocated bytes: 40000 -> 40960 per file on a 4 KiB-block tmpfs; 9000 -> 12288.
    assert users[alice.pw_uid]["bytes"] == 3 * 40960
    assert users[bob.pw_uid]["bytes"] == 5 * 12288


def test_control_actions_need_the_mount_owner(shared):
    m, alice, bob = shared
    f = m.path("bobs")
    assert as_user(bob, "open(sys.argv[1], 'wb').write(b'q' * 100)", f) == 0
    # Even on his own file, a user who does not own the mount cannot pin, evict or reconcile.
    for attr, value in (("user.kcachefs.pinned", b"1"), ("user.kcachefs.evict", b"1")):
        code = f"os.setxattr(sys.argv[1], '{attr}', {value!r})"
        assert as_user(bob, code, f) in (errno.EPERM, errno.EACCES)
    assert as_user(bob, "os.setxattr(sys.argv[1], 'user.kcachefs.reconcile', b'1')", m.mnt) in (errno.EPERM, errno.EACCES)
    assert os.path.exists(f) and os.getxattr(f, "user.kcachefs.pinned") == b"0"
    # Root may.
    os.setxattr(f, "user.kcachefs.pinned", b"1")
    assert os.getxattr(f, "user.kcachefs.pinned") == b"1"


@pytest.mark.parametrize("how", ["write", "truncate", "O_TRUNC"])
def test_a_write_by_another_user_clears_setuid_and_setgid(shared, how):
    """The kernel leaves this to the daemon (FUSE_HANDLE_KILLPRIV and _V2), and a root daemon's own writes
    to the backing file keep the bits (CAP_FSETID): it clears them itself, as the VFS would (fs/ops-io.c,
    SETUID). setgid goes only with group execute."""
    m, alice, bob = shared
    for mode, left in ((0o6777, 0o0777), (0o6767, 0o2767)):
        p = m.path(f"{how}-{mode:o}")
        with open(p, "wb") as f:
            f.write(b"k" * 8192)
        os.chmod(p, mode)
        back = os.path.join(m.backing, os.path.basename(p))
        assert os.stat(back).st_mode & 0o7777 == mode
        code = {"write": "fd = os.open(sys.argv[1], os.O_WRONLY); os.pwrite(fd, b'b', 0); os.close(fd)",
                "truncate": "os.truncate(sys.argv[1], 100)",
                "O_TRUNC": "os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC))"}[how]
        assert as_user(bob, code, p) == 0
        assert os.stat(back).st_mode & 0o7777 == left, f"{how} by another user left {os.stat(back).st_mode:o}"
        assert os.stat(p).st_mode & 0o7777 == left, f"stat through the mount after {how}: {os.stat(p).st_mode:o}"
        os.chmod(p, mode)  # root's own write keeps them (CAP_FSETID), as on any filesystem
        fd = os.open(p, os.O_WRONLY)
        os.pwrite(fd, b"r", 0)
        os.close(fd)
        assert os.stat(back).st_mode & 0o7777 == mode
