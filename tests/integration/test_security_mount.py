"""A node-wide shared mount is safe as documented, with two real accounts: allow_other alone keeps users
out of each other's files (the daemon adds default_permissions), every mount is nosuid,nodev whatever
mount(8) passes, a backing directory (or an index) that other users can reach by its path is refused with
one line naming the directory and the fix, -o tighten closes only what it promises, and the job prolog's
backing directory is out of users' reach."""
import errno
import os
import subprocess

import pytest

from conftest import ROOT, Mount, ensure_user, kcachefs_bin, private_dir, wait_for
from test_security_multiuser import as_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users and mount")


def mount_options(mnt):
    """(per-mount flags, filesystem options) of MNT in /proc/self/mountinfo."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            a = line.split()
            if a[4] == mnt:
                return set(a[5].split(",")), set(a[a.index("-") + 3].split(","))
    raise AssertionError(f"{mnt} is not in /proc/self/mountinfo")


def one_line(p, *needles):
    assert p.returncode != 0, p.stderr
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("kcachefs: "), p.stderr
    for n in needles:
        assert n in lines[0], p.stderr
    return lines[0]


def run(*args):
    return subprocess.run([kcachefs_bin(), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def users():
    return ensure_user("kcfs-alice"), ensure_user("kcfs-bob")


def test_allow_other_alone_keeps_users_out_of_each_others_files(kfs, users):
    alice, bob = users
    m = kfs({"allow_other": True, "max_size": "64M"})  # as README and kcachefs(8) used to write it
    os.chmod(m.mnt, 0o1777)
    p = m.path("alice-private")
    assert as_user(alice, "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600); os.write(fd, b'A' * 100)", p) == 0
    assert as_user(bob, "open(sys.argv[1], 'rb').read()", p) == errno.EACCES
    assert as_user(bob, "open(sys.argv[1], 'r+b').write(b'B')", p) == errno.EACCES
    assert as_user(bob, "os.chmod(sys.argv[1], 0o666)", p) == errno.EPERM
    assert as_user(bob, "os.unlink(sys.argv[1])", p) == errno.EPERM
    st = os.stat(p)
    assert (st.st_uid, st.st_mode & 0o777) == (alice.pw_uid, 0o600)
    assert open(p, "rb").read() == b"A" * 100
    assert "default_permissions added" in m.stderr, m.stderr  # and said so
    assert "default_permissions" in mount_options(m.mnt)[1]


def fuse_mount_cmd(how, backing, mnt, d):
    """Mounts through mount(8) and mount.fuse3 as fstab would (the FUSE type "fuse" with "PROGRAM#SOURCE"
    runs the binary under test, wherever it is)."""
    src = f"{os.path.abspath(kcachefs_bin())}#{backing}"
    if how == "mount -o suid,dev":
        return ["mount", "-t", "fuse", "-o", "allow_other,suid,dev,max_size=4M", src, mnt]
    fstab = os.path.join(d, "fstab")
    with open(fstab, "w") as f:
        f.write(f"{src} {mnt} fuse defaults,allow_other,max_size=4M 0 0\n")  # "defaults" means suid,dev
    return ["mount", "-T", fstab, mnt]


@pytest.mark.parametrize("how", ["kcachefs -o suid,dev", "mount -o suid,dev", "fstab defaults"])
def test_a_shared_mount_is_nosuid_nodev_even_when_asked_otherwise(workdir, how):
    d, cleanup = workdir
    backing, mnt = os.path.join(private_dir(d), "b"), os.path.join(d, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    cleanup.insert(0, mnt)
    if how.startswith("kcachefs"):
        p = run("-o", "allow_other,suid,dev,max_size=4M", backing, mnt)
    else:
        p = subprocess.run(fuse_mount_cmd(how, backing, mnt, d), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    wait_for(lambda: os.path.ismount(mnt), what="mount")
    flags, fsopts = mount_options(mnt)
    assert {"nosuid", "nodev"} <= flags, flags
    assert {"allow_other", "default_permissions"} <= fsopts, fsopts


def test_a_private_mount_is_nosuid_nodev_without_default_permissions(workdir):
    """Without allow_other nobody else uses the mount, so the kernel need not check permissions for the
    daemon; but a cache holds no setuid program or device node, so even a private mount is nosuid,nodev,
    whatever was asked (it used to keep suid,dev: the fstab line's "defaults" gave them)."""
    d, cleanup = workdir
    backing, mnt = os.path.join(private_dir(d), "b"), os.path.join(d, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    cleanup.insert(0, mnt)
    p = run("-o", "suid,dev,max_size=4M", backing, mnt)
    assert p.returncode == 0, p.stderr
    wait_for(lambda: os.path.ismount(mnt), what="mount")
    flags, fsopts = mount_options(mnt)
    assert {"nosuid", "nodev"} <= flags and "default_permissions" not in fsopts


def reachable_setup(kind, d, bob):
    """A backing directory that other users can reach by its path; returns (backing, the directory the
    message must name, that directory's mode)."""
    if kind == "0755 chain":
        top = os.path.join(d, "open")
        os.makedirs(top, mode=0o755)
        os.chmod(top, 0o755)
        backing = os.path.join(top, "backing")
    elif kind == "writable ancestor":
        top = os.path.join(d, "ww")
        os.makedirs(os.path.join(top, "priv"))
        os.chmod(top, 0o777)  # a 0700 directory below it does not help: the writer renames it away
        os.chmod(os.path.join(top, "priv"), 0o700)
        backing = os.path.join(top, "priv", "backing")
    elif kind == "ancestor of another user":
        top = os.path.join(d, "bobs")
        os.makedirs(top)
        os.chmod(top, 0o700)
        os.chown(top, bob.pw_uid, bob.pw_gid)
        backing = os.path.join(top, "backing")
    elif kind == "sticky shared parent":
        top = os.path.join(d, "tmp")
        os.makedirs(top)
        os.chmod(top, 0o1777)
        backing = os.path.join(top, "backing")
    os.makedirs(backing)
    return backing, top, os.stat(top).st_mode & 0o7777


KINDS = {"0755 chain": ("owner root, mode 0755", "chmod 700"),
         "writable ancestor": ("owner root, mode 0777", "chmod go-w"),
         "ancestor of another user": ("belongs to uid", "chown root"),
         "sticky shared parent": ("owner root, mode 1777", "a directory of its own")}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_backing_directory_others_can_reach_is_refused(workdir, users, kind):
    d, cleanup = workdir
    backing, top, mode = reachable_setup(kind, d, users[1])
    mnt = os.path.join(d, "m")
    os.makedirs(mnt)
    cleanup.insert(0, mnt)
    line = one_line(run("-o", "allow_other", backing, mnt), f"'{top}'", "can be reached by other users",
                    *KINDS[kind])
    if kind == "ancestor of another user":
        assert "kcfs-bob" in line
    assert not os.path.ismount(mnt)
    assert os.listdir(backing) == []  # nothing made
    assert os.stat(top).st_mode & 0o7777 == mode


def test_an_index_directory_others_can_reach_is_refused(workdir):
    d, cleanup = workdir
    backing, mnt = os.path.join(private_dir(d), "b"), os.path.join(d, "m")
    idx = os.path.join(d, "idx")
    for p in (backing, mnt, idx):
        os.makedirs(p)
    os.chmod(idx, 0o755)
    cleanup.insert(0, mnt)
    one_line(run("-o", f"index={idx}/i.db", backing, mnt), "index directory", f"chmod 700 '{idx}'")
    assert not os.path.ismount(mnt) and os.listdir(idx) == [] and os.listdir(backing) == []


def test_tighten_closes_the_parent_it_may_and_the_mount_serves(workdir, users):
    d, cleanup = workdir
    alice, bob = users
    backing, top, _ = reachable_setup("0755 chain", d, bob)
    idx = os.path.join(d, "idx")
    os.makedirs(idx)
    os.chmod(idx, 0o755)
    m = Mount(backing, os.path.join(d, "m"), {"allow_other": True, "tighten": True}, index=os.path.join(idx, "i.db"))
    os.makedirs(m.mnt)
    cleanup.insert(0, m.mnt)
    try:
        m.start()
        assert os.stat(top).st_mode & 0o7777 == 0o700
        assert os.stat(idx).st_mode & 0o7777 == 0o700
        assert f"closed '{top}'" in m.stderr and f"closed '{idx}'" in m.stderr, m.stderr
        os.chmod(m.mnt, 0o1777)
        assert as_user(bob, "open(sys.argv[1], 'wb').write(b'through the mount')", m.path("b")) == 0
        assert as_user(bob, "open(sys.argv[1], 'wb').write(b'behind its back')", os.path.join(backing, "x")) \
            == errno.EACCES
        assert as_user(bob, "os.listdir(sys.argv[1])", backing) == errno.EACCES
    finally:
        m.stop()


@pytest.mark.parametrize("kind", ["writable ancestor", "ancestor of another user", "sticky shared parent",
                                  "parent of the shared mount point"])
def test_tighten_changes_nothing_it_cannot_close_safely(workdir, users, kind):
    d, cleanup = workdir
    if kind == "parent of the shared mount point":
        top = os.path.join(d, "both")
        backing, mnt = os.path.join(top, "backing"), os.path.join(top, "mnt")
        os.makedirs(backing)
        os.chmod(top, 0o755)
        mode = 0o755
        needles = ("will not close", f"'{mnt}'")
    else:
        backing, top, mode = reachable_setup(kind, d, users[1])
        mnt = os.path.join(d, "m")
        needles = (f"'{top}'",)
    os.makedirs(mnt)
    cleanup.insert(0, mnt)
    one_line(run("-o", "allow_other,tighten", backing, mnt), *needles)
    assert os.stat(top).st_mode & 0o7777 == mode
    assert not os.path.ismount(mnt) and os.listdir(backing) == []


def test_users_cannot_write_into_the_backing_directory_the_prolog_makes(workdir, users):
    d, cleanup = workdir
    alice, bob = users
    node = os.path.join(d, "node")  # as /var/cache/kcachefs/private: missing, so the prolog makes it
    env = dict(os.environ, KCACHEFS_BACKING=os.path.join(node, "backing"), KCACHEFS_MOUNT=os.path.join(d, "pm"),
               KCACHEFS_BIN=os.path.abspath(kcachefs_bin()), KCACHEFS_OPTIONS="max_size=4M,allow_other")
    cleanup.insert(0, env["KCACHEFS_MOUNT"])
    subprocess.run([os.path.join(ROOT, "contrib", "hpc", "prolog-kcachefs.sh")], env=env, check=True,
                   capture_output=True, timeout=60)
    wait_for(lambda: os.path.ismount(env["KCACHEFS_MOUNT"]), what="mount")
    # Through the mount: yes, in his own directory (users/<uid>, which the daemon makes); straight into the
    # backing: no.
    assert as_user(bob, "home = os.getxattr(sys.argv[1], 'user.kcachefs.home').decode()\n"
                        "open(os.path.join(sys.argv[1], home, 'ok'), 'wb').write(b'x' * 4096)",
                   env["KCACHEFS_MOUNT"]) == 0
    assert os.path.exists(os.path.join(env["KCACHEFS_MOUNT"], "users", str(bob.pw_uid), "ok"))
    behind = os.path.join(env["KCACHEFS_BACKING"], "users", str(bob.pw_uid), "big")
    assert as_user(bob, "open(sys.argv[1], 'wb').write(b'x' * (20 << 20))", behind) == errno.EACCES
    assert as_user(bob, "os.symlink('/etc/shadow', sys.argv[1])", behind) == errno.EACCES
    assert not os.path.lexists(behind)
    assert os.stat(node).st_mode & 0o7777 == 0o700
    flags, _ = mount_options(env["KCACHEFS_MOUNT"])
    assert {"nosuid", "nodev"} <= flags
