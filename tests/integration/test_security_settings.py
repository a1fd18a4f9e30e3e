"""A root daemon's settings file (-o config=FILE, fs/settings.c S6): the daemon reads it at mount and at
SIGHUP, and it says where root writes (index, log, backing) and what every user's cache does (max_size,
pin...). So, as sshd's StrictModes, a file that another user can write, or replace through a directory
above it, is refused: the mount fails saying which file or directory to fix, and SIGHUP logs the refusal
and keeps every setting. The other user here is a real account writing through its own rights."""
import os
import signal
import subprocess

import pytest

from conftest import ensure_user, wait_for
from test_live_settings import M, config
from test_security_multiuser import as_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")

# alice's settings: a limit of her choosing for everybody's cache
ALICE_WRITES = "with open(sys.argv[1], 'w') as f:\n    f.write('max_size = 48M\\n')"
# alice replaces the file through the directory she owns (a new file renamed over it)
ALICE_REPLACES = ("t = sys.argv[1] + '.new'\nwith open(t, 'w') as f:\n    f.write('max_size = 48M\\n')\n"
                  "os.rename(t, sys.argv[1])")


def root_etc(d, name="kcachefs.conf", text="max_size = 8M\n"):
    """A directory of root's (0755) in d, and a settings file of root's in it: (the directory, the file)."""
    sub = os.path.join(d, "etc")
    os.mkdir(sub, 0o755)
    return sub, root_file(os.path.join(sub, name), text)


def root_file(path, text="max_size = 8M\n", mode=0o644):
    if os.path.lexists(path):
        os.unlink(path)  # a new file of root's, whoever had it
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize("how", ["file of alice", "file writable by all", "directory of alice",
                                 "directory writable by all"])
def test_a_settings_file_another_user_can_change_refuses_the_mount(kfs, workdir, how):
    d = workdir[0]
    alice = ensure_user("kcfs-alice")
    sub, conf = root_etc(d)
    if how == "file of alice":
        os.chown(conf, alice.pw_uid, alice.pw_gid)
        culprit, words = conf, "belongs to uid %d" % alice.pw_uid
    elif how == "file writable by all":
        os.chmod(conf, 0o666)
        culprit, words = conf, "writable by everyone"
    elif how == "directory of alice":
        os.chown(sub, alice.pw_uid, alice.pw_gid)
        culprit, words = sub, "belongs to uid %d" % alice.pw_uid
    else:
        os.chmod(sub, 0o777)
        culprit, words = sub, "writable by everyone and not sticky"
    code = ALICE_REPLACES if how.startswith("directory") else ALICE_WRITES
    assert as_user(alice, code, conf) == 0
    m = kfs({"config": conf}, start=False)
    p = m.start(check=False)
    if p.returncode == 0:
        got = config(m)["max_size"]
        subprocess.run(["fusermount3", "-u", m.mnt], capture_output=True)
        pytest.fail(f"mounted with alice's settings file (max_size {got})")
    assert f"the settings file '{conf}' can be changed" in p.stderr and f"'{culprit}'" in p.stderr, p.stderr
    assert words in p.stderr, p.stderr
    assert not os.path.ismount(m.mnt)


def test_a_sticky_directory_and_roots_own_file_in_it_are_fine(kfs, workdir):
    sub = os.path.join(workdir[0], "sticky")
    os.mkdir(sub)
    os.chmod(sub, 0o1777)  # like /tmp: others cannot rename or remove root's file there
    conf = root_file(os.path.join(sub, "kcachefs.conf"))
    m = kfs({"config": conf})
    assert config(m)["max_size"] == 8 * M


def test_a_symlink_to_the_settings_file_is_resolved_once_at_mount(kfs, workdir):
    """The operator's symlink is followed at mount (realpath); what is checked is the file it names."""
    d = workdir[0]
    alice = ensure_user("kcfs-alice")
    mine = os.path.join(d, "alice")
    os.mkdir(mine)
    os.chown(mine, alice.pw_uid, alice.pw_gid)
    link = os.path.join(d, "kcachefs.conf")
    assert as_user(alice, ALICE_WRITES, os.path.join(mine, "kcachefs.conf")) == 0
    os.symlink(os.path.join(mine, "kcachefs.conf"), link)
    m = kfs({"config": link}, start=False)
    p = m.start(check=False)
    assert p.returncode != 0 and f"'{mine}' belongs to uid {alice.pw_uid}" in p.stderr, p.stderr


@pytest.mark.parametrize("how", ["file made writable by all", "directory given to alice"])
def test_sighup_refuses_a_settings_file_another_user_can_change(kfs, workdir, how):
    d = workdir[0]
    alice = ensure_user("kcfs-alice")
    sub, conf = root_etc(d)
    log = os.path.join(d, "kcachefs-messages.log")
    m = kfs({"config": conf, "log": log})
    before, pid = config(m), m.pid()
    assert before["max_size"] == 8 * M
    if how == "file made writable by all":
        os.chmod(conf, 0o666)  # an operator's mistake, which alice uses
        assert as_user(alice, ALICE_WRITES, conf) == 0
    else:
        os.chown(sub, alice.pw_uid, alice.pw_gid)
        assert as_user(alice, ALICE_REPLACES, conf) == 0
    os.kill(pid, signal.SIGHUP)
    text = wait_for(lambda: (lambda t: ("refused" in t or "re-read" in t) and t)(open(log).read()),
                    what="SIGHUP's answer in the log")
    assert "refused" in text and "can be changed" in text and "kept as they were" in text, text
    assert config(m) == before
    assert os.path.ismount(m.mnt) and m.pid() == pid
    # fixed by the operator, the next SIGHUP reads it again
    os.chown(sub, 0, 0)
    root_file(conf, "max_size = 16M\n")
    os.kill(pid, signal.SIGHUP)
    wait_for(lambda: config(m)["max_size"] == 16 * M, what="the fixed file re-read")


@pytest.mark.parametrize("how", ["file of alice", "directory of alice"])
def test_the_units_prepare_step_refuses_a_settings_file_another_user_can_change(workdir, how):
    """The systemd unit's ExecStartPre reads the file as root before kcachefs does (its backing = line names
    the directories it makes): a file alice can change must not make root create what she chooses."""
    import re
    from test_contrib import CONTRIB, systemd_expand
    d = workdir[0]
    alice = ensure_user("kcfs-alice")
    unit = open(os.path.join(CONTRIB, "systemd", "kcachefs@.service.in")).read()
    pre = dict(re.findall(r"^(Exec\w+)=(.*)$", unit, re.M))["ExecStartPre"]
    sub, conf = root_etc(d, "inst.conf", "max_size = 10G\n")
    if how == "file of alice":
        os.chown(conf, alice.pw_uid, alice.pw_gid)
        assert as_user(alice, "open(sys.argv[1], 'a').write('backing = ' + sys.argv[2] + '\\n')", conf,
                       os.path.join(d, "hers", "made", "by-root")) == 0
    else:
        os.chown(sub, alice.pw_uid, alice.pw_gid)
        assert as_user(alice, ALICE_REPLACES.replace("max_size = 48M", "backing = " + os.path.join(
            d, "hers", "made", "by-root")), conf) == 0
    p = subprocess.run(systemd_expand(pre, {"KCACHEFS_CONF": conf}, os.path.join(d, "unit-mnt")),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "a user other than root may change it: refused" in p.stderr, p.stderr
    assert not os.path.exists(os.path.join(d, "hers")), "root made the directories alice named"
