"""The shared tier's key is a path (fs/remote/remote.h, KEYS): whoever can rename on the way to a unit's
files chooses which key its bytes are stored under. On a publishing node shared by every user, Bob makes
the directories where the CI account's runtime will store a program, open to all; the CI account's files
land there (its own, so the owner check of publish.c P2 passes), and Bob renames them into the directory of
another kernel: without a check of the way, the publisher's namespace, which every reader trusts, then
serves kernel A's binary for kernel B. A unit is published only when nobody but its owner and root can
change a directory on its way (publish.c P2)."""
import os
import shutil

import pytest

from conftest import ensure_user, wait_for
from test_remote import acl_redis, auth_file  # noqa: F401
from test_remote_trust import STORE, UNIT, keys, shared
from test_security_multiuser import as_user

pytestmark = [pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs Debian's redis-server"),
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")]

A = "pocl/a1/a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"  # kernel A's program directory, at the mount's root
B = "pocl/b2/b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2"  # kernel B's

BOB_PREPARES = """
for rel in sys.argv[2:]:
    p = sys.argv[1]
    for c in rel.split('/'):
        p = os.path.join(p, c)
        os.makedirs(p, exist_ok=True)
        os.chmod(p, 0o777)
"""

CI_STORES = """
d = os.path.join(sys.argv[1], sys.argv[2])
for rel, data in (('last_accessed', b'1'), ('program.bc', b"kernel A's binary " * 500)):
    with open(os.path.join(d, rel), 'wb') as f:
        f.write(data)
"""

BOB_MOVES = """
for name in ('last_accessed', 'program.bc'):
    os.rename(os.path.join(sys.argv[1], sys.argv[2], name), os.path.join(sys.argv[1], sys.argv[3], name))
"""


def test_a_publishers_files_where_another_user_can_rename_are_not_published(kfs, acl_redis, workdir):
    d = workdir[0]
    ci, bob = ensure_user("kcfs-ci"), ensure_user("kcfs-bob")
    pub = shared(kfs, acl_redis, remote_publish="ci", remote_publisher="kcfs-ci",
                 remote_auth=auth_file(d, "publisher-ci ci-secret"))
    assert as_user(bob, BOB_PREPARES, pub.mnt, A, B) == 0
    assert as_user(ci, CI_STORES, pub.mnt, A) == 0
    assert os.stat(pub.path(A, "program.bc")).st_uid == ci.pw_uid
    assert as_user(bob, BOB_MOVES, pub.mnt, A, B) == 0  # the CI account's files, now kernel B's
    assert os.stat(pub.path(B, "program.bc")).st_uid == ci.pw_uid
    # the CI account's own unit in its own directory afterwards: published, so the publisher has been
    # through what was noted before it
    assert as_user(ci, STORE, pub.mnt, "ci's kernel") == 0
    wait_for(lambda: f"kcfs:1:p:ci:{UNIT}/program.bc" in keys(acl_redis), timeout=20,
             what="ci's own unit published")
    poisoned = acl_redis.cli("GET", f"kcfs:1:p:ci:{B}/program.bc", raw=True).strip()  # nil: an empty line
    assert not poisoned, "kernel B's key in the trusted namespace holds: %r" % poisoned[:40]
    k = keys(acl_redis)
    assert not any(A in x or B in x for x in k), k
