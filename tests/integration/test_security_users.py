"""Each user's entries in a directory of their own on a shared mount (fs/users.c): kcache env on a mount
that others use (allow_other) points every runtime at MOUNT/users/<uid>/<runtime>, made by the daemon for
that user, 0700, so that no user's binary is ever loaded by another's process. Two (or three) real
accounts, run through runuser."""
import errno
import os
import re
import stat
import subprocess

import pytest

from conftest import ROOT, ensure_user, wait_for
from test_security_multiuser import KCACHE, as_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")

HOME = "user.kcachefs.home"
CLK = os.path.join(ROOT, "build", "tests", "clkernels")


def env_as(u, mnt, *runtimes):
    """{variable: value} that `kcache env MNT RUNTIMES` prints for user U (who must succeed)."""
    p = subprocess.run(["runuser", "-u", u.pw_name, "--", KCACHE, "env", mnt, *runtimes], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return {k: v.strip("'") for k, v in re.findall(r"([A-Z_]+)=('[^']*'|[^ ;\n]+)", p.stdout)}


def env_fails_as(u, mnt, *runtimes):
    p = subprocess.run(["runuser", "-u", u.pw_name, "--", KCACHE, "env", mnt, *runtimes], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0, p.stdout
    return p.stderr


@pytest.fixture
def shared(kfs):
    """A node-wide mount as the HPC prolog makes it, with a root any user may write (like /tmp): the
    hardest case, where a user could also try to make names in the root."""
    m = kfs({"allow_other": True, "default_permissions": True, "max_size": "64M"}, start=False)
    return m, ensure_user("kcfs-alice"), ensure_user("kcfs-bob")


def start_shared(m):
    m.start()
    os.chmod(m.mnt, 0o1777)


def mode_owner(path):
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid


def test_each_user_gets_a_directory_of_their_own(shared):
    m, alice, bob = shared
    start_shared(m)
    b = env_as(bob, m.mnt, "pocl", "neo")
    # Bob looks Alice's future directory up first: the miss must not hide it from her later (U4).
    assert as_user(bob, "os.stat(sys.argv[1])", m.path("users", str(alice.pw_uid))) == errno.ENOENT
    a = env_as(alice, m.mnt, "pocl", "neo")
    for u, e in ((alice, a), (bob, b)):
        home = m.path("users", str(u.pw_uid))
        assert e["POCL_CACHE_DIR"] == os.path.join(home, "pocl")
        assert e["NEO_CACHE_DIR"] == os.path.join(home, "neo")
        assert mode_owner(home) == (0o700, u.pw_uid)
        assert mode_owner(os.path.join(m.backing, "users", str(u.pw_uid))) == (0o700, u.pw_uid)
        assert os.lstat(e["POCL_CACHE_DIR"]).st_uid == u.pw_uid
        assert os.getxattr(e["POCL_CACHE_DIR"], "user.kcachefs.runtime") == b"pocl"
        assert as_user(u, "assert os.getxattr(sys.argv[1], 'user.kcachefs.home') == sys.argv[2].encode()", m.mnt,
                       f"users/{u.pw_uid}") == 0
    assert mode_owner(m.path("users")) == (0o711, 0)
    # Alice's runtime stores; Bob can neither read it, nor add, replace or remove anything in her tree.
    entry = os.path.join(a["POCL_CACHE_DIR"], "ab", "x" * 37, "program.bc")
    assert as_user(alice, "os.makedirs(os.path.dirname(sys.argv[1])); open(sys.argv[1], 'wb').write(b'A' * 100)",
                   entry) == 0
    assert as_user(bob, "open(sys.argv[1], 'rb').read()", entry) == errno.EACCES
    assert as_user(bob, "os.listdir(sys.argv[1])", a["POCL_CACHE_DIR"]) == errno.EACCES
    assert as_user(bob, "os.mkdir(sys.argv[1])", os.path.join(a["POCL_CACHE_DIR"], "cd")) == errno.EACCES
    assert as_user(bob, "open(sys.argv[1], 'wb').write(b'B')", os.path.join(b["POCL_CACHE_DIR"], "f")) == 0
    assert as_user(bob, "os.rename(sys.argv[1], sys.argv[2])", os.path.join(b["POCL_CACHE_DIR"], "f"),
                   entry) == errno.EACCES
    assert as_user(bob, "os.rename(sys.argv[1], sys.argv[2])", m.path("users", str(alice.pw_uid)),
                   m.path("stolen")) == errno.EACCES
    assert as_user(bob, "os.listdir(sys.argv[1])", m.path("users")) == errno.EACCES  # who uses it: nobody's business
    assert open(entry, "rb").read() == b"A" * 100


def test_nobody_gets_the_daemon_to_make_a_directory_elsewhere(shared):
    m, alice, bob = shared
    start_shared(m)
    env_as(bob, m.mnt, "pocl")
    users = m.path("users")
    # The name is the caller's uid, from the kernel: nothing the caller says chooses it.
    assert as_user(bob, "os.setxattr(sys.argv[1], 'user.kcachefs.home', b'../../etc')", m.mnt) in (errno.EPERM,
                                                                                                  errno.EACCES)
    sub = os.path.join(users, str(bob.pw_uid), "pocl")
    assert as_user(bob, "os.getxattr(sys.argv[1], 'user.kcachefs.home')", sub) == errno.ENODATA  # only on the root
    assert as_user(bob, "os.mkdir(sys.argv[1])", os.path.join(users, str(alice.pw_uid))) == errno.EACCES
    assert as_user(bob, "os.symlink('/etc', sys.argv[1])", os.path.join(users, str(alice.pw_uid))) == errno.EACCES
    # A mark is only for a runtime's directory in one's own tree, never for the container or a user's root.
    assert as_user(bob, "os.setxattr(sys.argv[1], 'user.kcachefs.runtime', b'pocl')",
                   os.path.join(users, str(bob.pw_uid))) == errno.EINVAL
    assert sorted(os.listdir(os.path.join(m.backing, "users"))) == [str(bob.pw_uid)]
    assert sorted(os.listdir(os.path.join(m.backing, "users", str(bob.pw_uid)))) == ["pocl"]


def test_what_others_planted_is_never_followed_and_is_set_aside(shared, tmp_path):
    """users/<uid> made by someone else directly in the backing directory before the mount (a symlink out
    of the tree, a file, another user's directory) is set aside at mount (U2), and each user then gets a
    directory of their own; what the symlink pointed at is untouched."""
    m, alice, bob = shared
    carol = ensure_user("kcfs-carol")
    outside = tmp_path / "outside"
    outside.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(outside, 0o777)
    users = os.path.join(m.backing, "users")
    os.mkdir(users, 0o711)
    os.symlink(str(outside), os.path.join(users, str(alice.pw_uid)))
    open(os.path.join(users, str(carol.pw_uid)), "w").write("not a directory")
    os.mkdir(os.path.join(users, str(bob.pw_uid)), 0o777)
    os.chown(os.path.join(users, str(bob.pw_uid)), alice.pw_uid, alice.pw_gid)  # Bob's name, Alice's directory
    os.mkdir(os.path.join(users, str(bob.pw_uid), "pocl"))
    start_shared(m)
    for u in (alice, bob, carol):
        e = env_as(u, m.mnt, "pocl")
        home = os.path.join(users, str(u.pw_uid))
        assert e["POCL_CACHE_DIR"] == m.path("users", str(u.pw_uid), "pocl")
        assert not os.path.islink(home) and mode_owner(home) == (0o700, u.pw_uid)
        assert os.listdir(home) == ["pocl"]
    assert os.listdir(outside) == []
    aside = sorted(n for n in os.listdir(users) if ".untrusted-" in n)
    assert sorted(n.split(".")[0] for n in aside) == sorted(str(u.pw_uid) for u in (alice, bob, carol))
    kcache("verify", m.mnt)  # the index was told of every move and every directory made


def test_a_users_container_is_never_a_users(shared):
    """A shared mount makes users/ as it mounts, so Bob cannot make it first through the writable root (a
    users/ of his would be refused, and nobody would get a directory until the next mount). One that is
    not the daemon's own, left in the backing directory before the mount (U1), is set aside (U2) and a new
    one made."""
    m, alice, bob = shared
    start_shared(m)
    assert mode_owner(m.path("users")) == (0o711, 0)
    assert as_user(bob, "os.mkdir(sys.argv[1], 0o777)", m.path("users")) == errno.EEXIST
    assert as_user(bob, "os.mkdir(sys.argv[1], 0o777)", m.path("users", str(alice.pw_uid))) == errno.EACCES
    e = env_as(alice, m.mnt, "pocl")
    assert e["POCL_CACHE_DIR"] == m.path("users", str(alice.pw_uid), "pocl")
    m.stop()
    os.rename(os.path.join(m.backing, "users"), os.path.join(m.backing, "users.old"))
    os.mkdir(os.path.join(m.backing, "users"), 0o777)
    os.chown(os.path.join(m.backing, "users"), bob.pw_uid, bob.pw_gid)
    os.mkdir(os.path.join(m.backing, "users", str(alice.pw_uid)), 0o777)
    m.opts["rebuild"] = True  # the files put behind its back are indexed
    start_shared(m)
    assert mode_owner(m.path("users")) == (0o711, 0)
    assert [n for n in os.listdir(m.mnt) if n.startswith("users.untrusted-")]
    e = env_as(alice, m.mnt, "pocl")
    assert e["POCL_CACHE_DIR"] == m.path("users", str(alice.pw_uid), "pocl")
    assert mode_owner(m.path("users", str(alice.pw_uid))) == (0o700, alice.pw_uid)
    kcache("verify", m.mnt)


def test_the_pocl_attack_no_longer_reaches_another_user(shared):
    """Bob pre-creates PoCL's directories in a shared pocl/ (what the prolog used to make, 1777) with his own
    program directory; with kcache env, Alice's PoCL never looks there, and Bob cannot plant in hers."""
    m, alice, bob = shared
    start_shared(m)
    os.mkdir(m.path("pocl"))
    os.chmod(m.path("pocl"), 0o1777)
    planted = "ab/" + "c" * 37 + "/"
    code = ("for d in sys.argv[1:]:\n"
            "    os.makedirs(d + '/" + planted + "kern/1-1-1', exist_ok=True)\n"
            "    open(d + '/" + planted + "program.bc', 'wb').write(b'evil')\n"
            "    open(d + '/" + planted + "kern/1-1-1/kern.so', 'wb').write(b'evil')")
    assert as_user(bob, code, m.path("pocl")) == 0  # the shared directory: still plantable, and never used
    a = env_as(alice, m.mnt, "pocl")
    assert as_user(bob, code, a["POCL_CACHE_DIR"]) == errno.EACCES
    assert not os.path.exists(os.path.join(a["POCL_CACHE_DIR"], "ab"))
    b = env_as(bob, m.mnt, "pocl")
    assert b["POCL_CACHE_DIR"] != a["POCL_CACHE_DIR"]
    if os.path.exists(CLK) and os.path.exists("/etc/OpenCL/vendors/pocl.icd"):
        # Real PoCL, as Alice: it builds and caches in her own directory, and finds nothing of Bob's there.
        p = subprocess.run(["runuser", "-u", alice.pw_name, "--", "env", f"POCL_CACHE_DIR={a['POCL_CACHE_DIR']}",
                            "HOME=/tmp", CLK, "0", "1", "1"], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        made = [os.path.join(dp, f) for dp, _, fs in os.walk(a["POCL_CACHE_DIR"]) for f in fs]
        assert made and all(os.stat(f).st_uid == alice.pw_uid for f in made)
        assert all(open(f, "rb").read() != b"evil" for f in made)


def sycl_like_entry(d):
    """Three files a SYCL entry would have; anywhere but SYCL's cache, they are three files."""
    os.makedirs(d, exist_ok=True)
    for suffix in (".bin", ".src", "_access_time.txt"):
        with open(os.path.join(d, "7" + suffix), "wb") as f:
            f.write(b"x" * 4096)


def kcache(*args):
    subprocess.run([KCACHE, *args], check=True, capture_output=True, text=True, timeout=60)


def test_marks_in_a_users_directory_make_that_runtimes_rules_apply(shared):
    """As in the root (test_runtimes_conformance: the directory kcache env made is that runtime's): Numba's
    directory in Alice's tree holding files named like a SYCL entry loses one file when one is evicted,
    where an unmarked directory beside it loses the whole 'entry'; the mark outlives a remount. Eviction
    never removes the runtime's directory or the user's, emptied."""
    m, alice, bob = shared
    start_shared(m)
    e = env_as(alice, m.mnt, "numba", "kcache")
    numba = e["NUMBA_CACHE_DIR"]
    home = os.path.dirname(numba)
    assert os.getxattr(numba, "user.kcachefs.runtime") == b"numba"
    sycl_like_entry(os.path.join(numba, "d"))
    sycl_like_entry(os.path.join(home, "other", "d"))
    kcache("evict", os.path.join(home, "other", "d", "7.bin"))
    assert os.listdir(os.path.join(home, "other", "d")) == []  # recognised as SYCL's by layout
    kcache("evict", os.path.join(numba, "d", "7.bin"))
    assert sorted(os.listdir(os.path.join(numba, "d"))) == ["7.src", "7_access_time.txt"]
    m.stop()
    start_shared(m)
    assert os.getxattr(numba, "user.kcachefs.runtime") == b"numba"
    kcache("evict", os.path.join(numba, "d", "7.src"))
    assert os.listdir(os.path.join(numba, "d")) == ["7_access_time.txt"]
    # Renamed by its owner, the directory takes its mark along; removed, it loses it.
    assert as_user(alice, "os.rename(sys.argv[1], sys.argv[2])", numba, numba + "2") == 0
    assert os.getxattr(numba + "2", "user.kcachefs.runtime") == b"numba"
    assert as_user(alice, "os.mkdir(sys.argv[1])", numba) == 0
    with pytest.raises(OSError):
        os.getxattr(numba, "user.kcachefs.runtime")  # a new directory of the old name: no mark
    assert as_user(alice, "os.rmdir(sys.argv[1]); os.rename(sys.argv[2], sys.argv[1])", numba, numba + "2") == 0
    assert os.getxattr(numba, "user.kcachefs.runtime") == b"numba"
    # Bob's mark on a directory of his does not reach Alice's, nor his plain directory's files.
    assert as_user(bob, "os.setxattr(sys.argv[1], 'user.kcachefs.runtime', b'numba')", numba) in (errno.EACCES,
                                                                                                errno.EPERM)
    # A runtime that prunes what eviction empties: its directory and Alice's stay.
    kc = e["KCACHE_DIR"]
    os.makedirs(os.path.join(kc, "x", "y"))
    open(os.path.join(kc, "x", "y", "entry"), "wb").write(b"k" * 4096)
    kcache("evict", os.path.join(kc, "x", "y", "entry"))
    wait_for(lambda: not os.path.exists(os.path.join(kc, "x")), what="the emptied directories pruned")
    assert os.path.isdir(kc) and os.path.isdir(home) and mode_owner(home) == (0o700, alice.pw_uid)


def test_a_personal_mount_is_as_before(kfs):
    """Without allow_other, kcache env puts the runtimes' directories in the mount itself, and no users/."""
    m = kfs({"max_size": "64M"})
    out = subprocess.run([KCACHE, "env", m.mnt, "pocl"], capture_output=True, text=True, check=True).stdout
    assert f"POCL_CACHE_DIR='{m.path('pocl')}'" in out
    assert sorted(os.listdir(m.mnt)) == ["pocl"]
