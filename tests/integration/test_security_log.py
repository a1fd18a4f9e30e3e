"""-o log=FILE of a root daemon in a directory that other users can write into (a sticky one, like /tmp):
another user may have put a name there first. The daemon must not append its messages, as root, through
her symlink to a file of root's, nor into her own file (she would read and forge the node's log): such a
log is refused at mount, saying why."""
import os
import subprocess

import pytest

from conftest import ensure_user
from test_security_multiuser import as_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")


@pytest.mark.parametrize("how", ["symlink to a root file", "her own file"])
def test_a_log_file_another_user_put_there_is_refused(kfs, workdir, how):
    d = workdir[0]
    alice = ensure_user("kcfs-alice")
    tmp = os.path.join(d, "tmp")
    os.mkdir(tmp)
    os.chmod(tmp, 0o1777)
    victim = os.path.join(d, "victim")
    with open(victim, "w") as f:
        f.write("root's\n")
    log = os.path.join(tmp, "kcachefs.log")
    code = {"symlink to a root file": "os.symlink(sys.argv[2], sys.argv[1])",
            "her own file": "os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o666)); os.chmod(sys.argv[1], 0o666)"}[how]
    assert as_user(alice, code, log, victim) == 0
    m = kfs({"log": log}, start=False)
    p = m.start(check=False)
    if p.returncode == 0:
        subprocess.run(["fusermount3", "-u", m.mnt], capture_output=True)
    assert open(victim).read() == "root's\n", "the root daemon wrote its log into " + victim
    if how == "her own file":
        assert os.path.getsize(log) == 0, "the root daemon wrote its log into alice's file"
    assert p.returncode != 0 and f"the log '{log}'" in p.stderr, p.stderr
    assert not os.path.ismount(m.mnt)
