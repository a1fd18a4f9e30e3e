"""quickstart --uninstall run by root (a user installed with sudo, or root for a user's paths): the mount
record under PREFIX names a mount point whose way runs through another user's directory. That user swaps
a directory on the way for a symlink to another mount; root's uninstall must not unmount (or remove)
what the symlink leads to. The uninstall acts on such a path with the rights of the user who can change
it (fusermount3 then unmounts only that user's mounts), and leaves a way it cannot trust alone."""
import os
import shutil
import subprocess

import pytest

from conftest import ROOT, ensure_user, kcachefs_bin, private_dir, wait_for
from test_security_multiuser import as_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")


def fake_install(prefix, mnt, backing):
    """What quickstart records (installed-files, mount) for an install under prefix, its daemon copied in."""
    os.makedirs(os.path.join(prefix, "sbin"))
    os.makedirs(os.path.join(prefix, "share", "kcachefs"))
    daemon = os.path.join(prefix, "sbin", "kcachefs")
    shutil.copy(kcachefs_bin(), daemon)
    os.chmod(daemon, 0o755)
    with open(os.path.join(prefix, "share", "kcachefs", "installed-files"), "w") as f:
        f.write(daemon + "\n")
    with open(os.path.join(prefix, "share", "kcachefs", "mount"), "w") as f:
        f.write(f"{mnt}\n{backing}\nmade\n")
    return daemon


def exe(pid):
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


@pytest.mark.parametrize("swap", [True, False])
def test_root_uninstall_never_unmounts_where_a_users_symlink_leads(kfs, workdir, swap):
    """swap: alice swaps her directory for a symlink (the way is not trusted: nothing done). Without the
    swap, the unmount runs with alice's rights (she could swap it at any moment): fusermount3 then unmounts
    only her own mounts, and the daemon here is root's, so it is left, and said."""
    d = workdir[0]
    alice = ensure_user("kcfs-alice")
    victim = kfs({})  # another cache of this node, root's: what alice wants gone
    name = os.path.basename(victim.mnt)
    home = os.path.join(d, "alice")
    os.mkdir(home)
    os.chown(home, alice.pw_uid, alice.pw_gid)
    kc = os.path.join(home, "kc")
    mnt = os.path.join(kc, name)  # the mount point the install recorded, in alice's directory
    os.makedirs(mnt)
    os.chown(kc, alice.pw_uid, alice.pw_gid)
    backing = os.path.join(private_dir(d), "qs-backing")
    os.makedirs(backing)
    prefix = os.path.join(d, "prefix")
    daemon = fake_install(prefix, mnt, backing)
    # the install's daemon serves the recorded mount point (root runs it here: this machine has no FUSE
    # mounts for users; alice's own daemon would do as well)
    subprocess.run([daemon, backing, mnt], check=True, capture_output=True, timeout=60)
    moved = kc + ".old"
    try:
        assert os.path.ismount(mnt)
        # alice moves her directory away (the mount goes with it) and puts a symlink in its place that
        # leads the recorded path to the victim's mount point
        if swap:
            assert as_user(alice, "os.rename(sys.argv[1], sys.argv[2]); os.symlink(sys.argv[3], sys.argv[1])",
                           kc, moved, os.path.dirname(victim.mnt)) == 0
            assert os.path.ismount(os.path.join(moved, name))
        p = subprocess.run([os.path.join(ROOT, "quickstart"), "--uninstall"], env=dict(os.environ, PREFIX=prefix),
                           capture_output=True, text=True, timeout=120)
        assert os.path.ismount(victim.mnt), "root's uninstall unmounted another cache: " + p.stdout + p.stderr
        assert p.returncode != 0 and "nothing removed" in p.stderr, p.stdout + p.stderr
        assert os.path.exists(daemon)  # nothing removed while its daemon serves
        if not swap:
            assert f"cannot unmount {mnt} as uid {alice.pw_uid}" in p.stderr and os.path.ismount(mnt), p.stderr
    finally:
        subprocess.run(["fusermount3", "-u", os.path.join(moved, name)], capture_output=True)
        subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
        wait_for(lambda: not any(exe(p) == os.path.realpath(daemon) for p in os.listdir("/proc") if p.isdigit()),
                 what="the install's daemon gone")


def test_root_uninstall_removes_no_directory_where_a_users_symlink_leads(workdir):
    """The mount point the install made is removed (rmdir) at the end: never through alice's symlink."""
    d = workdir[0]
    alice = ensure_user("kcfs-alice")
    home = os.path.join(d, "alice")
    os.mkdir(home)
    os.chown(home, alice.pw_uid, alice.pw_gid)
    kc = os.path.join(home, "kc")
    os.makedirs(os.path.join(kc, "mnt"))
    os.chown(kc, alice.pw_uid, alice.pw_gid)
    target = os.path.join(d, "roots")  # root's empty directory named as the mount point
    os.makedirs(os.path.join(target, "mnt"))
    prefix = os.path.join(d, "prefix")
    fake_install(prefix, os.path.join(kc, "mnt"), os.path.join(d, "backing"))
    assert as_user(alice, "os.rename(sys.argv[1], sys.argv[1] + '.old'); os.symlink(sys.argv[2], sys.argv[1])",
                   kc, target) == 0
    p = subprocess.run([os.path.join(ROOT, "quickstart"), "--uninstall"], env=dict(os.environ, PREFIX=prefix),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert os.path.isdir(os.path.join(target, "mnt")), "root's uninstall removed a directory of root's: " + p.stdout


@pytest.mark.parametrize("how", ["dotdot", "symlink"])
def test_root_uninstall_of_a_users_prefix_removes_only_what_that_user_could(workdir, how):
    """PREFIX is alice's (she installed there herself): the records under it are hers to write. Root's
    uninstall must not remove, as root, what she names in them (a path with .., or through a symlink
    that she put in her prefix): it runs with her rights."""
    d = workdir[0]
    alice = ensure_user("kcfs-alice")
    victim = os.path.join(d, "roots")
    os.mkdir(victim)
    with open(os.path.join(victim, "precious"), "w") as f:
        f.write("root's\n")
    prefix = os.path.join(d, "prefix")
    os.mkdir(prefix)
    os.chown(prefix, alice.pw_uid, alice.pw_gid)
    line = os.path.join(prefix, "..", "roots", "precious") if how == "dotdot" else \
        os.path.join(prefix, "lib", "precious")
    code = ("os.makedirs(os.path.join(sys.argv[1], 'share', 'kcachefs'))\n"
            "with open(os.path.join(sys.argv[1], 'share', 'kcachefs', 'installed-files'), 'w') as f:\n"
            "    f.write(sys.argv[2] + '\\n')\n"
            "if sys.argv[3] == 'symlink':\n"
            "    os.symlink(sys.argv[4], os.path.join(sys.argv[1], 'lib'))\n")
    assert as_user(alice, code, prefix, line, how, victim) == 0
    p = subprocess.run([os.path.join(ROOT, "quickstart"), "--uninstall"], env=dict(os.environ, PREFIX=prefix),
                       capture_output=True, text=True, timeout=120)
    assert os.path.exists(os.path.join(victim, "precious")), "root's uninstall removed root's file: " + p.stdout
    assert f"with the rights of uid {alice.pw_uid}" in p.stdout + p.stderr, p.stdout + p.stderr
