"""Trusted publishers on the shared tier (docs/remote.md, Trust; fs/remote/remote.h, TRUST): a mount with
-o remote_publish=NAME stores its units in the publisher's namespace kcfs:1:p:NAME:, readers with
-o remote_trusted=NAME look there after their own namespace, and the server's ACLs (the shipped
contrib/redis/kcachefs-users.acl, on a real redis-server) let the nodes read it and nobody but the
publisher's ACL user write it. Several mounts on this machine play the nodes (test_remote.py)."""
import json
import os
import shutil
import subprocess

import pytest

from conftest import ensure_user, wait_for
from test_cli_kcache import kcache, kcache_bin
from test_remote import (LOAD, STORE, acl_redis, auth_file, node, num, pocl_program, published,  # noqa: F401
                         redis)
from test_security_multiuser import as_user

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs Debian's redis-server")

UNIT = "pocl/ab/cdefghijklmnopqrstuvwxyzabcdefghijklm"  # STORE's and LOAD's program, below a user's home
STORE_OVER = STORE.replace("'1-1-1'))", "'1-1-1'), exist_ok=True)")  # over what is there
assert STORE_OVER != STORE


def shared(kfs, r, **opts):
    """A node shared by every user (root's daemon, allow_other), as test_remote.shared_node, with options."""
    o = {"allow_other": True, "default_permissions": True, "max_size": "64M", "remote": r.url,
         "remote_timeout_ms": "500"}
    o.update(opts)
    m = kfs(o)
    os.chmod(m.mnt, 0o1777)
    return m


def cli_as(r, user, password, *args):
    p = subprocess.run(["redis-cli", "-s", r.sock, "--user", user, "--pass", password, "--no-auth-warning", *args],
                       capture_output=True, text=True, timeout=30)
    return p.stdout + p.stderr


def keys(r):
    return r.cli("KEYS", "*").split()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")
def test_a_publishers_units_are_loaded_by_every_user_and_another_users_never(kfs, acl_redis, workdir):
    d, _ = workdir
    ci, alice, bob = ensure_user("kcfs-ci"), ensure_user("kcfs-alice"), ensure_user("kcfs-bob")
    nodes = auth_file(d, "kcachefs nodes-secret")
    # the CI account compiles on its node, whose mount publishes with the publisher's ACL user
    pub = shared(kfs, acl_redis, remote_publish="ci", remote_publisher="kcfs-ci",
                 remote_auth=auth_file(d, "publisher-ci ci-secret"))
    assert as_user(ci, STORE, pub.mnt, "ci's kernel") == 0
    published(pub)
    # another user of the publishing node is not the publisher: his unit goes to his own namespace, which
    # the publisher's ACL user may not write (a counted error), never into the publisher's
    assert as_user(bob, STORE, pub.mnt, "bob's kernel on the CI node") == 0
    wait_for(lambda: num(pub, "remote_errors") >= 1, timeout=20, what="bob's publish refused")
    assert num(pub, "remote_publishes") == 1
    assert b"bob" not in b"".join(acl_redis.cli("GET", x, raw=True) or b"" for x in keys(acl_redis))
    pub_errors = num(pub, "remote_errors")
    k = keys(acl_redis)
    assert k and all(x.split(":")[:4] in (["kcfs", "1", "p", "ci"], ["kcfsl", "1", "p", "ci"]) for x in k), k
    # its paths are relative to the CI account's own directory: any user's lookup in theirs finds them
    assert f"kcfs:1:p:ci:{UNIT}/program.bc" in k, k
    assert num(pub, "remote_errors") == pub_errors
    # two users on another node, each in their own directory: both load it, compiling nothing
    a = shared(kfs, acl_redis, remote_trusted="ci", remote_auth=nodes, remote_touch_s="0.2")
    for u in (alice, bob):
        assert as_user(u, LOAD, a.mnt, "ci's kernel") == 0, u.pw_name
        unit = a.path("users", str(u.pw_uid), UNIT)
        for rel in ("program.bc", "last_accessed", "k/1-1-1/k.so", "k/1-1-1", "k"):
            assert os.lstat(os.path.join(unit, rel)).st_uid == u.pw_uid, rel  # files of the user's own
    assert num(a, "remote_hits") == 2 and num(a, "remote_trusted_hits") == 2
    assert "2 of the units fetched came from trusted publishers" in kcache("stats", a.mnt).stdout
    # the reader's touches reach the publisher's keys (TOUCH is a read to the ACLs), refused nowhere
    wait_for(lambda: num(a, "remote_touches") >= 1, timeout=20, what="the trusted unit touched")
    assert num(a, "remote_errors") == 0
    # Bob stores his own compile at the same place on that node: into his namespace, never the publisher's
    assert as_user(bob, STORE_OVER, a.mnt, "bob's kernel") == 0
    wait_for(lambda: num(a, "remote_publishes") >= 1, timeout=20, what="bob's unit published")
    assert any(x.startswith(f"kcfs:1:u{bob.pw_uid}:users/{bob.pw_uid}/{UNIT}") for x in keys(acl_redis))
    assert b"ci's kernel" in acl_redis.cli("GET", f"kcfs:1:p:ci:{UNIT}/program.bc", raw=True)
    # Alice, on a third node, trusting the publisher too, gets the publisher's unit and never Bob's
    b = shared(kfs, acl_redis, remote_trusted="ci", remote_auth=nodes)
    assert as_user(alice, LOAD, b.mnt, "ci's kernel") == 0
    assert num(b, "remote_trusted_hits") == 1
    assert not any(x.startswith(f"kcfs:1:u{alice.pw_uid}:") for x in keys(acl_redis))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")
def test_a_node_cannot_write_a_publishers_namespace(kfs, acl_redis, workdir):
    """A node's credentials with remote_publish=: the server refuses every write (NOPERM), which is a counted
    error and never the application's; and the same refusals straight from redis-cli."""
    d, _ = workdir
    bob = ensure_user("kcfs-bob")
    rogue = shared(kfs, acl_redis, remote_publish="ci", remote_publisher=str(bob.pw_uid),
                   remote_auth=auth_file(d, "kcachefs nodes-secret"))
    assert as_user(bob, STORE, rogue.mnt, "bob's kernel") == 0
    wait_for(lambda: num(rogue, "remote_errors") >= 1, timeout=20, what="the refused publish counted")
    assert num(rogue, "remote_publishes") == 0
    assert acl_redis.cli("DBSIZE").strip() == "0"
    assert as_user(bob, LOAD, rogue.mnt, "bob's kernel") == 0  # the local tier as without a remote
    node_cli = lambda *a: cli_as(acl_redis, "kcachefs", "nodes-secret", *a)
    for cmd in (["SET", f"kcfs:1:p:ci:{UNIT}/program.bc", "x"], ["DEL", f"kcfs:1:p:ci:{UNIT}/program.bc"],
                ["SADD", f"kcfsl:1:p:ci:{UNIT}", "program.bc"], ["SET", f"kcfsh:1:p:ci:{UNIT}/program.bc", "n"]):
        assert "NOPERM" in node_cli(*cmd), cmd
    # what a node may do there: read and touch
    assert "NOPERM" not in node_cli("GET", f"kcfs:1:p:ci:{UNIT}/program.bc")
    assert node_cli("TOUCH", f"kcfs:1:p:ci:{UNIT}/program.bc").strip() == "0"
    # and the publisher writes its own namespace only
    ci_cli = lambda *a: cli_as(acl_redis, "publisher-ci", "ci-secret", *a)
    assert "NOPERM" in ci_cli("SET", f"kcfs:1:u{bob.pw_uid}:users/{bob.pw_uid}/{UNIT}/program.bc", "x")
    assert "NOPERM" in ci_cli("SET", f"kcfs:1:p:other:{UNIT}/program.bc", "x")
    assert acl_redis.cli("DBSIZE").strip() == "0"


def get_calls(r):
    for line in r.cli("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_get:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def test_the_own_namespace_first_then_the_trusted_in_order_each_miss_remembered(kfs, redis):
    pub = node(kfs, redis, remote_publish="ci")  # a publisher's own mount (one user's, not shared)
    # readers (made first: their pocl/ would come from the server once it is there)
    b, own, c = node(kfs, redis, remote_trusted="nothing:ci"), node(kfs, redis), node(kfs, redis, remote_trusted="ci")
    files = pocl_program(pub.path("pocl"), "k-ci")
    published(pub)
    assert all(":p:ci:" in k for k in keys(redis)), keys(redis)
    marker = next(p for p in files if p.endswith("program.bc"))
    # a reader trusting a publisher with nothing, then ci: ci's unit, whole
    for rel, data in files.items():
        with open(os.path.join(b.path("pocl"), rel), "rb") as f:
            assert f.read() == data, rel
    assert num(b, "remote_hits") == 1 and num(b, "remote_trusted_hits") == 1
    assert "p:nothing" not in " ".join(keys(redis))  # read, never written
    # the user's own unit at the same place comes before the publisher's
    pocl_program(own.path("pocl"), "k-ci", kernels=("mine",))
    published(own)
    assert os.path.exists(os.path.join(c.path("pocl"), marker))
    unit = os.path.dirname(os.path.join(c.path("pocl"), marker))
    assert "mine" in os.listdir(unit) and "vadd" not in os.listdir(unit)  # a listing looks nothing up
    assert num(c, "remote_hits") == 1 and num(c, "remote_trusted_hits") == 0
    # kcache remote names the namespaces a lookup asks, in order
    out = kcache("remote", b.mnt).stdout
    assert f"namespace   kcfs:1:u{os.getuid()}:*" in out and "trusted     kcfs:1:p:nothing: kcfs:1:p:ci: " in out, out
    assert "namespace   kcfs:1:p:ci:* (a trusted publisher's" in kcache("remote", pub.mnt).stdout
    j = json.loads(kcache("remote", "--json", b.mnt).stdout)
    assert j["namespace"] == f"kcfs:1:u{os.getuid()}:" and j["trusted"] == ["kcfs:1:p:nothing:", "kcfs:1:p:ci:"], j
    # a name that is nowhere: one GET per namespace, then none for remote_negative_s
    missing = os.path.join(c.path("pocl"), "zz", "nothing-here")
    before, calls = num(c, "remote_misses"), get_calls(redis)
    assert not os.path.exists(missing)
    assert get_calls(redis) - calls == 2  # zz in the own namespace and in ci's; zz/... is never asked
    calls = get_calls(redis)
    for _ in range(10):
        subprocess.run(["stat", missing], capture_output=True, timeout=30)
    assert get_calls(redis) == calls
    assert num(c, "remote_misses") == before + 1


@pytest.mark.parametrize("opts,why", [({"remote_publish": "CI"}, "invalid remote_publish"),
                                      ({"remote_publish": "a" * 33}, "invalid remote_publish"),
                                      ({"remote_publish": "ci", "remote_publisher": "kcfs-no-such-user"},
                                       "invalid remote_publisher"),
                                      ({"remote_publisher": "0"}, "remote_publisher= needs remote_publish="),
                                      ({"remote_trusted": "ci::admin"}, "invalid remote_trusted"),
                                      ({"remote_trusted": ":".join("n%d" % i for i in range(9))}, "invalid remote_trusted"),
                                      ({"remote_trusted": "ci", "remote": None}, "remote_trusted= needs remote=")])
def test_bad_publisher_names_are_refused_at_mount(kfs, redis, opts, why):
    o = {"remote": redis.url}
    o.update(opts)
    if o["remote"] is None:
        del o["remote"]
    m = kfs(o, start=False)
    p = m.start(check=False)
    assert p.returncode != 0 and why in p.stderr, p.stderr
    assert not os.path.ismount(m.mnt)


def test_a_bad_value_in_a_trusted_namespace_is_a_counted_miss_and_left_there(kfs, redis):
    """A reader only reads a publisher's namespace: a value there that does not check is counted and
    remembered, never deleted (the server's ACLs would refuse it; the publisher mends its own)."""
    c = node(kfs, redis, remote_trusted="ci")
    redis.cli("SET", "kcfs:1:p:ci:pocl/zz", "not a unit")
    assert not os.path.exists(os.path.join(c.path("pocl"), "zz"))
    assert num(c, "remote_corrupt") == 1 and num(c, "remote_hits") == 0
    assert redis.cli("GET", "kcfs:1:p:ci:pocl/zz").strip() == "not a unit"


@pytest.mark.skipif(os.geteuid() != 0, reason="the prolog mounts as root")
def test_the_job_prolog_passes_the_trusted_publishers(workdir, redis):
    from conftest import ROOT, kcachefs_bin
    d, cleanup = workdir
    env = dict(os.environ, KCACHEFS_BACKING=os.path.join(d, "node", "pb"), KCACHEFS_MOUNT=os.path.join(d, "pm"),
               KCACHEFS_BIN=os.path.abspath(kcachefs_bin()), KCACHEFS_OPTIONS="max_size=1G,allow_other",
               KCACHEFS_REMOTE=redis.url, KCACHEFS_REMOTE_TRUSTED="ci:admin")
    cleanup.insert(0, env["KCACHEFS_MOUNT"])
    subprocess.run([os.path.join(ROOT, "contrib", "hpc", "prolog-kcachefs.sh")], env=env, check=True)
    out = kcache("remote", env["KCACHEFS_MOUNT"]).stdout
    assert "trusted     kcfs:1:p:ci: kcfs:1:p:admin: " in out, out


CLK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "build", "tests",
                   "clkernels")


def clk_as(u, cache, first, count):
    """build/tests/clkernels as user u, with PoCL's cache in cache: PoCL's trace."""
    p = subprocess.run(["runuser", "-u", u.pw_name, "--", "env", f"POCL_CACHE_DIR={cache}", "POCL_DEBUG=general,llvm",
                        "HOME=/tmp", CLK, str(first), str(count), "1"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "0 failures" in p.stdout, p.stderr[-2000:]
    return p.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(CLK) or not os.path.exists("/etc/OpenCL/vendors/pocl.icd"),
                    reason="needs root, PoCL and build/tests/clkernels")
def test_real_pocl_a_publishers_programs_compile_for_nobody_else(kfs, acl_redis, workdir):
    """The CI account compiles with the real PoCL on its node; two users on another node run the same
    programs and compile nothing, with the same results."""
    d, _ = workdir
    ci, alice, bob = ensure_user("kcfs-ci"), ensure_user("kcfs-alice"), ensure_user("kcfs-bob")
    pub = shared(kfs, acl_redis, remote_publish="ci", remote_publisher="kcfs-ci",
                 remote_auth=auth_file(d, "publisher-ci ci-secret"))
    a = shared(kfs, acl_redis, remote_trusted="ci", remote_auth=auth_file(d, "kcachefs nodes-secret"))

    def cache_of(m, u):
        home = subprocess.run(["runuser", "-u", u.pw_name, "--", "getfattr", "--only-values", "-n",
                               "user.kcachefs.home", m.mnt], capture_output=True, text=True, timeout=30).stdout
        assert home.startswith("users/"), home
        return os.path.join(m.mnt, home, "pocl")

    trace = clk_as(ci, cache_of(pub, ci), 0, 2)
    assert trace.count("Writing program.bc") == 2  # the publisher compiles
    wait_for(lambda: num(pub, "remote_publishes") >= 2, timeout=30, what="two programs published")
    sos = [os.path.relpath(os.path.join(dp, f), cache_of(pub, ci)) for dp, _, fns in os.walk(cache_of(pub, ci))
           for f in fns if f.endswith(".so")]
    assert len(sos) >= 2
    wait_for(lambda: all(acl_redis.cli("EXISTS", f"kcfs:1:p:ci:pocl/{so}").strip() == "1" for so in sos),
             timeout=30, what="the kernels published with their programs")
    for u in (alice, bob):
        trace = clk_as(u, cache_of(a, u), 0, 2)
        assert "Writing program.bc" not in trace, f"{u.pw_name} compiled a program the publisher had published"
        assert "Built a specialized WG function" not in trace, f"{u.pw_name} built a kernel the publisher had"
    assert num(a, "remote_trusted_hits") == 4 and num(a, "remote_errors") == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")
def test_other_users_of_a_publishing_node_read_the_publishers_namespace(kfs, acl_redis, workdir):
    """On the CI node itself (remote_publish=ci, remote_publisher=the CI account, remote_trusted=ci), another
    user's own namespace is theirs (u<uid>), and the publisher's is trusted after it: alice loads what the CI
    account published, as her own files, and kcache remote says both namespaces. (Before, the publisher's
    namespace was skipped for everybody on such a mount, as if it were each user's own; her own namespace,
    which the publisher's ACL user may not read, ended the lookup as if the server were down; and the
    publisher's own misses of those names, remembered while it compiled, hid them from her.)"""
    d, _ = workdir
    ci, alice = ensure_user("kcfs-ci"), ensure_user("kcfs-alice")
    pub = shared(kfs, acl_redis, remote_publish="ci", remote_publisher="kcfs-ci", remote_trusted="ci",
                 remote_auth=auth_file(d, "publisher-ci ci-secret"))
    assert as_user(ci, STORE, pub.mnt, "ci's kernel") == 0
    published(pub)
    # alice's directory on the same node: empty, so her lookup misses locally, in u<alice>, then finds p:ci
    assert as_user(alice, LOAD, pub.mnt, "ci's kernel") == 0
    assert num(pub, "remote_trusted_hits") == 1
    out = subprocess.run(["runuser", "-u", alice.pw_name, "--", kcache_bin(), "remote", "--json", pub.mnt],
                         capture_output=True, text=True, timeout=30)
    info = json.loads(out.stdout)
    assert info["namespace"] == f"kcfs:1:u{alice.pw_uid}:" and info["trusted"] == ["kcfs:1:p:ci:"], info
