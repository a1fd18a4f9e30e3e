"""kcache stats -o FILE run by root (a cron job writing a textfile collector's file): the output is written
under a temporary name and renamed over FILE (cli/export.c). Another user must not choose where root
writes: not by a symlink of hers on the way to FILE's directory, nor by a directory of hers above it (she
could swap what is below at any moment). FILE's own directory may be anybody's (a collector's directory of
its own account, a sticky /tmp): the temporary name and the rename stay in that directory, held open."""
import os

import pytest

from conftest import ensure_user
from test_cli_kcache import kcache
from test_security_multiuser import as_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")


def dirs(d):
    tmp = os.path.join(d, "tmp")
    os.mkdir(tmp)
    os.chmod(tmp, 0o1777)
    etc = os.path.join(d, "etc")  # root's, with a file root cares about
    os.mkdir(etc)
    with open(os.path.join(etc, "out.prom"), "w") as f:
        f.write("root's\n")
    return tmp, etc


def test_stats_output_never_follows_another_users_symlink(kfs, workdir):
    d = workdir[0]
    alice = ensure_user("kcfs-alice")
    m = kfs({})
    tmp, etc = dirs(d)
    assert as_user(alice, "os.symlink(sys.argv[1], sys.argv[2])", etc, os.path.join(tmp, "stats")) == 0
    p = kcache("stats", "--prometheus", "-o", os.path.join(tmp, "stats", "out.prom"), m.mnt, check=False)
    assert open(os.path.join(etc, "out.prom")).read() == "root's\n", "root's file replaced through alice's symlink"
    assert p.returncode == 1 and f"symbolic link of uid {alice.pw_uid}" in p.stderr, p.stderr
    assert os.listdir(etc) == ["out.prom"]


def test_stats_output_below_another_users_directory_is_refused(kfs, workdir):
    d = workdir[0]
    alice = ensure_user("kcfs-alice")
    m = kfs({})
    tmp, _ = dirs(d)
    assert as_user(alice, "os.makedirs(os.path.join(sys.argv[1], 'a', 'b'))", tmp) == 0
    p = kcache("stats", "--json", "-o", os.path.join(tmp, "a", "b", "out.json"), m.mnt, check=False)
    assert p.returncode == 1 and f"belongs to uid {alice.pw_uid}" in p.stderr, p.stderr
    assert not os.path.exists(os.path.join(tmp, "a", "b", "out.json"))


def test_stats_output_into_a_sticky_or_another_users_directory_itself(kfs, workdir):
    """What a collector's setup looks like: FILE's own directory is /tmp-like, or another account's."""
    d = workdir[0]
    alice = ensure_user("kcfs-alice")
    m = kfs({})
    tmp, _ = dirs(d)
    hers = os.path.join(d, "textfile")
    os.mkdir(hers)
    os.chown(hers, alice.pw_uid, alice.pw_gid)
    for out in (os.path.join(tmp, "out.prom"), os.path.join(hers, "out.prom")):
        kcache("stats", "--prometheus", "-o", out, m.mnt)
        assert "kcachefs_used_bytes" in open(out).read()
        assert os.stat(out).st_uid == 0 and sorted(os.listdir(os.path.dirname(out))) == ["out.prom"]


FLIPPER = """
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
a, b = sys.argv[1].encode(), sys.argv[2].encode()
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    libc.renameat2(-100, a, -100, b, 2)  # RENAME_EXCHANGE: her directory and her symlink swap places
"""


def test_stats_output_while_another_user_swaps_her_directory_for_a_symlink(kfs, workdir):
    """FILE's own directory is alice's, in a sticky /tmp: she may swap it for a symlink at any moment (a
    checked path and a later open of it may differ). The directory is reached by a walk that follows no
    link of hers and is held once reached: root writes into her directory or refuses, never elsewhere."""
    import subprocess
    d = workdir[0]
    alice = ensure_user("kcfs-alice")
    m = kfs({})
    tmp, etc = dirs(d)
    hers, link = os.path.join(tmp, "hers"), os.path.join(tmp, "link")
    assert as_user(alice, "os.mkdir(sys.argv[1]); os.symlink(sys.argv[2], sys.argv[3])", hers, etc, link) == 0
    flip = subprocess.Popen(["runuser", "-u", alice.pw_name, "--", "/usr/bin/python3", "-c",
                             "import sys\n" + FLIPPER, hers, link, "60"])
    try:
        outcomes = set()
        for _ in range(150):
            p = kcache("stats", "--prometheus", "-o", os.path.join(hers, "out.prom"), m.mnt, check=False)
            outcomes.add(p.returncode)
            assert open(os.path.join(etc, "out.prom")).read() == "root's\n", "root wrote through alice's symlink"
            assert os.listdir(etc) == ["out.prom"]
    finally:
        flip.kill()
        flip.wait()
    assert outcomes <= {0, 1}, outcomes
