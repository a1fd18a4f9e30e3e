"""Attacks on a shared mount (issue "Safe to share"): the daemon runs as root with allow_other and
default_permissions, the runtimes' directories are 1777 (contrib/hpc/prolog-kcachefs.sh), and an ordinary
user B (the attacker) creates, renames and symlinks in them through the mount. User A (the victim) keeps
her files outside the backing directory, on another filesystem: a tmpfs of its own (the canary). Whatever
B does, the daemon must never write, truncate or remove anything of A's (common/tree.h, R1-R4), and its
index must stay exact.

Each test is named after the rule it checks. B's actions run as B (runuser) through the mount; the canary
is owned by A, private (0700 directories, 0600 files), and compared afterwards byte for byte, with its
names, modes, owners, inode numbers and times. Where the attack needs A's files to have the inode numbers
of B's (eviction checks st_ino only), the canary's fresh tmpfs is made to give them those numbers, and
os.stat says so before the attack starts.

KCACHEFS_ATTACK_SECONDS sets how long the property test runs (default 60); KCACHEFS_ATTACK_SEED its seed
(default: a new one, printed)."""
import errno
import hashlib
import os
import random
import stat
import struct
import subprocess
import sys
import time

import pytest

from conftest import mount_tmpfs, wait_for
from test_cli_kcache import kcache

K = 1024
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable  # B and A must be able to run it

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users and mount tmpfs")

# The directories the HPC prolog makes in the mount, each 1777 like /tmp.
RUNTIME_DIRS = ("neo", "sycl", "pocl", "kcache")


# ---------------------------------------------------------------- two accounts
def as_user(u, code, *args, timeout=120):
    """Runs python CODE as user U (argv as sys.argv[1:]); returns its stdout. Fails the test if it fails."""
    p = subprocess.run(["runuser", "-u", u.pw_name, "--", PY, "-c", code, *map(str, args)],
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"as {u.pw_name}: {p.stderr}"
    return p.stdout


def spawn_as(u, code, *args):
    """Starts python CODE as user U in the background; stdin and stdout are pipes."""
    return subprocess.Popen(["runuser", "-u", u.pw_name, "--", PY, "-c", code, *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def finish(p, timeout=60):
    """Ends a process of spawn_as: closes its stdin (its signal to stop) and waits; returns its stdout."""
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        raise
    return out


@pytest.fixture
def users():
    from conftest import ensure_user
    return ensure_user("kcfs-victim"), ensure_user("kcfs-attacker")


@pytest.fixture
def shared(kfs):
    """Factory: a shared mount as the prolog makes it (allow_other, default_permissions, 1777 runtime
    directories), with no grace period so that eviction takes what it is asked to."""
    def make(**opts):
        o = {"allow_other": True, "default_permissions": True, "max_size": "64M", "grace_ms": "0"}
        o.update(opts)
        m = kfs(o)
        for d in RUNTIME_DIRS:
            os.mkdir(m.path(d))
            os.chmod(m.path(d), 0o1777)
        return m
    return make


@pytest.fixture
def canary_fs(workdir):
    """Another filesystem, outside the backing: a fresh tmpfs of its own (unmounted by workdir)."""
    d, mounts = workdir
    path = os.path.join(d, "canary")
    mount_tmpfs(path, "128m")
    mounts.append(path)
    os.chmod(path, 0o755)
    return path


# ---------------------------------------------------------------- A's canary
def own(path, u, mode):
    os.chown(path, u.pw_uid, u.pw_gid, follow_symlinks=False)
    os.chmod(path, mode)


def canary_dir(path, a):
    """path and the directories above it that it makes: A's, private."""
    if os.path.isdir(path):
        return
    canary_dir(os.path.dirname(path), a)
    os.mkdir(path)
    own(path, a, 0o700)


def canary_file(path, a, data):
    with open(path, "wb") as f:
        f.write(data)
    own(path, a, 0o600)


def snapshot(root):
    """Everything of the tree at root that A would miss: per name, its type, mode, owner, inode, link
    count, size, times of change, and the checksum of its bytes (or a symlink's target). Read with
    descriptors, never following a symlink."""
    def entry(st, sha=None, link=None):
        return (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_ino,
                st.st_nlink, st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha, link)

    out = {".": entry(os.lstat(root))}
    for dp, dns, fns, dfd in os.fwalk(root):
        for n in dns + fns:
            rel = os.path.relpath(os.path.join(dp, n), root)
            st = os.stat(n, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                fd = os.open(n, os.O_RDONLY | os.O_NOFOLLOW | os.O_NOATIME, dir_fd=dfd)
                h = hashlib.sha256()
                with os.fdopen(fd, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 16), b""):
                        h.update(chunk)
                out[rel] = entry(st, sha=h.hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = entry(st, link=os.readlink(n, dir_fd=dfd))
            else:
                out[rel] = entry(st)
    return out


def assert_canary_intact(root, before):
    after = snapshot(root)
    fields = ("type", "mode", "uid", "gid", "ino", "nlink", "size", "mtime", "ctime", "sha256", "link")
    diff = []
    for rel in sorted(set(before) | set(after)):
        b, a = before.get(rel), after.get(rel)
        if b is None:
            diff.append(f"{rel}: made by the daemon")
        elif a is None:
            diff.append(f"{rel}: removed")
        elif a != b:
            diff.append(f"{rel}: " + ", ".join(f"{k} {x!r} -> {y!r}" for k, x, y in zip(fields, b, a) if x != y))
    assert not diff, f"A's files outside the backing were changed ({len(diff)}): " + "; ".join(diff[:12])


# ---------------------------------------------------------------- the index
def tree_files(backing):
    """{relative path: allocated bytes} of the regular files of a backing directory, walked with
    descriptors (paths deeper than PATH_MAX included), symlinks not followed."""
    out = {}
    for dp, dns, fns, dfd in os.fwalk(backing):
        if dp == backing and ".kcachefs" in dns:
            dns.remove(".kcachefs")
        for n in fns:
            st = os.stat(n, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                out[os.path.normpath(os.path.join(os.path.relpath(dp, backing), n))] = st.st_blocks * 512
    return out


def assert_index_exact(m):
    """kcache verify finds no difference; then, the daemon stopped, the index holds exactly the tree."""
    v = kcache("verify", m.mnt, check=False)
    assert v.returncode == 0 and "matches" in v.stdout, f"kcache verify: {v.stdout}{v.stderr}"
    m.stop()
    rows, tree = m.index_rows(), tree_files(m.backing)
    only_idx = sorted(set(rows) - set(tree))[:5]
    only_tree = sorted(set(tree) - set(rows))[:5]
    differ = sorted(p for p in set(rows) & set(tree) if rows[p] != tree[p])[:5]
    assert rows == tree, f"index vs tree: only in the index {only_idx}, only in the tree {only_tree}, differ {differ}"


# ---------------------------------------------------------------- B's moves, as B, through the mount
WRITE = """
import os, sys
path, size = sys.argv[1], int(sys.argv[2])
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "wb") as f:
    f.write(os.urandom(size))
"""

SWAP = """
import os, sys
d, aside, target = sys.argv[1:4]
os.rename(d, aside)
os.symlink(target, d)
"""


def b_write(b, path, size=4 * K):
    as_user(b, WRITE, path, size)


def evict_all(m):
    """An eviction batch, as any write past the limit would start one: here the operator's, synchronous."""
    kcache("evict", m.mnt, "--to", "0")


# ---------------------------------------------------------------- 1. repairs
SYCL_B = """
import os, sys
cache = sys.argv[1]
entry = os.path.join(cache, "dev0", "img0", "spec0", "opt0")
os.makedirs(entry)
for suffix, data in ((".bin", os.urandom(8192)), (".src", b"key"), ("_access_time.txt", b"1")):
    with open(os.path.join(entry, "0" + suffix), "wb") as f:
        f.write(data)
with open(os.path.join(cache, "cache_size.txt"), "w") as f:
    f.write("8195")
# B takes SYCL's lock on his cache_size.txt and keeps it: the daemon's repair must wait.
os.close(os.open(os.path.join(cache, "cache_size.txt.lock"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o200))
print(os.path.join(entry, "0.bin"))
"""

NEO_B = """
import fcntl, os, struct, sys
cache = sys.argv[1]
os.makedirs(cache)
binary = os.path.join(cache, "0123456789abcdef.cl_cache")
with open(binary, "wb") as f:
    f.write(os.urandom(8192))
fd = os.open(os.path.join(cache, "config.file"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o664)
os.pwrite(fd, struct.pack("=Q", 8192), 0)
# B takes NEO's lock (flock on config.file) and keeps it until told: the daemon's repair must wait.
fcntl.flock(fd, fcntl.LOCK_EX)
print(binary, flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("rt", ["sycl", "neo"])
def test_a_repair_never_writes_outside_the_backing(shared, canary_fs, users, rt):
    """Attack 1. After eviction takes one of B's SYCL (NEO) entries, the daemon repairs B's
    cache_size.txt (config.file), but B holds the runtime's lock, so the repair waits for a later batch.
    Meanwhile B puts a symlink to A's private cache in place of a directory of the path. The repair must
    never follow it: A's size file (0600, outside the backing) stays as it was."""
    a, b = users
    m = shared()
    size_file = {"sycl": "cache_size.txt", "neo": "config.file"}[rt]
    alice = os.path.join(canary_fs, "alice")
    canary_dir(os.path.join(alice, "cache"), a)
    canary_file(os.path.join(alice, "cache", size_file), a,
                b"123456" if rt == "sycl" else struct.pack("=Q", 0x5EC12E7))
    canary_file(os.path.join(alice, "cache", "0.bin" if rt == "sycl" else "fedcba9876543210.cl_cache"), a,
                os.urandom(4096))
    before = snapshot(canary_fs)

    bob = m.path(rt, "bob")
    holder = None
    if rt == "sycl":
        victim = as_user(b, SYCL_B, os.path.join(bob, "cache")).strip()
    else:
        holder = spawn_as(b, NEO_B, os.path.join(bob, "cache"))
        victim = holder.stdout.readline().strip()
    try:
        b_size = open(os.path.join(bob, "cache", size_file), "rb").read()
        kcache("evict", victim)  # B's entry goes; its repair finds B's lock held, and waits
        assert not os.path.exists(victim)
        assert open(os.path.join(bob, "cache", size_file), "rb").read() == b_size  # not repaired yet
        as_user(b, SWAP, bob, m.path(rt, "bob.old"), alice)
        b_write(b, m.path(rt, "filler"))
        evict_all(m)  # the next batch retries the repair
        assert_canary_intact(canary_fs, before)
    finally:
        if holder:
            finish(holder)
    if rt == "sycl":
        as_user(b, "import os, sys; os.unlink(sys.argv[1])", m.path(rt, "bob.old", "cache", "cache_size.txt.lock"))
    assert_index_exact(m)
    assert_canary_intact(canary_fs, before)


# ---------------------------------------------------------------- 3. pruning
def test_pruning_never_removes_a_directory_outside_the_backing(shared, canary_fs, users):
    """Attack 3. Eviction empties B's directory kcache/bob/x/e, which B named a moment ago, so its removal
    waits for the directory grace (2 s) and is done later. Meanwhile B puts a symlink to A's private tree
    (holding an empty x/e) in place of kcache/bob. The later removal must not follow it: A's empty
    directory stays."""
    a, b = users
    m = shared()
    alice = os.path.join(canary_fs, "alice")
    canary_dir(os.path.join(alice, "x", "e"), a)
    canary_file(os.path.join(alice, "x", "notes"), a, b"A's notes\n")
    before = snapshot(canary_fs)

    bob = m.path("kcache", "bob")
    b_write(b, os.path.join(bob, "x", "e", "f"))
    kcache("evict", os.path.join(bob, "x", "e", "f"))  # e is emptied, but was named just now: pruned later
    assert os.listdir(os.path.join(bob, "x", "e")) == []
    as_user(b, SWAP, bob, m.path("kcache", "bob.old"), alice)
    swapped = time.monotonic()
    # The removal is due 2 s after e was last named (DIR_GRACE in fs/evict/prune.c); the descent looks at it
    # then, and any eviction batch after that does too.
    wait_for(lambda: time.monotonic() > swapped + 2.5, timeout=10, what="the directory grace to pass")
    b_write(b, m.path("kcache", "filler"))
    evict_all(m)
    assert_canary_intact(canary_fs, before)
    assert_index_exact(m)


# ---------------------------------------------------------------- 2. eviction on another filesystem
B_TREE = """
import os, sys
x, ndirs, nfiles = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for k in range(ndirs):  # the directories first, then the files: their inode numbers in one run
    os.makedirs(os.path.join(x, f"d{k}"))
for j in range(nfiles):  # across the directories: one batch of victims touches all of them
    for k in range(ndirs):
        with open(os.path.join(x, f"d{k}", f"f{j}"), "wb") as f:
            f.write(os.urandom(4096))
"""

# B swaps the directory x for a symlink to A's tree and back, as fast as he can, until told to stop; x
# is a directory again when he stops.
TOGGLE = """
import os, random, select, sys
x, aside, target, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rnd = random.Random(seed)
n = 0
while not select.select([sys.stdin], [], [], 0)[0]:
    os.rename(x, aside)
    os.symlink(target, x)
    select.select([sys.stdin], [], [], rnd.random() * 0.004)
    os.unlink(x)
    os.rename(aside, x)
    select.select([sys.stdin], [], [], rnd.random() * 0.002)
    n += 1
print(n)
"""


def twin_files(canary, a, files):
    """For each (inode number, relative path) of files, in increasing order of inode number, makes A's
    file of that path below canary with that inode number, on the canary's tmpfs (which numbers its
    inodes in sequence: numbers passed are burnt with throwaway files). Returns how many got their twin."""
    made = 0
    tmp = os.path.join(canary, ".twin")
    for ino, rel in sorted(files):
        while True:
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            got = os.fstat(fd).st_ino
            if got < ino:
                os.close(fd)
                os.unlink(tmp)
                continue
            if got == ino:
                os.write(fd, hashlib.sha256(rel.encode()).digest() * 128)
                os.close(fd)
                own(tmp, a, 0o600)
                os.rename(tmp, os.path.join(canary, rel))
                assert os.stat(os.path.join(canary, rel)).st_ino == ino
                made += 1
            else:
                os.close(fd)
                os.unlink(tmp)
            break
    return made


def backing_inos(backing, rel):
    """[(inode number, path relative to rel)] of the regular files below backing/rel."""
    top = os.path.join(backing, rel)
    return [(os.stat(os.path.join(dp, n)).st_ino, os.path.relpath(os.path.join(dp, n), top))
            for dp, _, fns in os.walk(top) for n in fns]


def attack_seconds(default):
    return float(os.environ.get("KCACHEFS_ATTACK_SECONDS") or default)


def attack_seed():
    seed = int(os.environ.get("KCACHEFS_ATTACK_SEED") or random.randrange(1 << 30))
    print(f"seed {seed} (KCACHEFS_ATTACK_SEED={seed} repeats it)")
    return seed


def test_eviction_never_removes_a_file_on_another_filesystem(shared, canary_fs, users):
    """Attack 2. B's files kcache/bob/x/rN/dK/fJ have the inode numbers of A's files alice/rN/dK/fJ on
    another filesystem (made so on purpose). While they are evicted, a little at a time, B swaps x for a
    symlink to A's tree and back. Eviction must only ever remove the file it chose, in the backing: none
    of A's files goes. Rounds of 512 files each, for 20 s (or KCACHEFS_ATTACK_SECONDS), or until the
    first of A's files is touched."""
    a, b = users
    m = shared()
    ndirs, nfiles = 64, 8
    x = m.path("kcache", "bob", "x")
    alice = os.path.join(canary_fs, "alice")
    rnd = random.Random(attack_seed())
    deadline = time.monotonic() + attack_seconds(20)
    rounds = toggles = 0
    while rounds == 0 or time.monotonic() < deadline:
        sub = f"r{rounds}"
        base = m.used()
        as_user(b, B_TREE, os.path.join(x, sub), ndirs, nfiles)
        for k in range(ndirs):
            canary_dir(os.path.join(alice, sub, f"d{k}"), a)
        files = backing_inos(m.backing, f"kcache/bob/x/{sub}")
        made = twin_files(os.path.join(alice, sub), a, files)
        assert made >= len(files) * 9 // 10, f"only {made} of {len(files)} of A's files got the inode number of B's"
        before = snapshot(canary_fs)
        toggler = spawn_as(b, TOGGLE, x, m.path("kcache", "bob", "x.real"), alice, rnd.randrange(1 << 30))
        try:
            # Eviction a little at a time, as writes past the limit make it, until B's files are gone.
            end = time.monotonic() + 60
            while time.monotonic() < end and m.used() > base + 16 * K:
                kcache("evict", m.mnt, "--to", str(max(m.used() - 256 * K, base)))
        finally:
            toggles += int(finish(toggler))
        rounds += 1
        assert_canary_intact(canary_fs, before)
    print(f"{rounds} rounds; B swapped x {toggles} times")
    assert_index_exact(m)


# ---------------------------------------------------------------- 7. names deeper than PATH_MAX
DEEP = """
import errno, os, sys
base, levels, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.makedirs(base, exist_ok=True)
fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
for i in range(levels):  # each name 240 bytes: the path passes PATH_MAX, no component NAME_MAX
    name = f"{i:03d}" + "d" * 237
    try:
        os.mkdir(name, 0o755, dir_fd=fd)
    except FileExistsError:
        pass
    nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    fd = nfd
made = 0
for j in range(count):
    try:
        f = os.open(f"{sys.argv[5]}{j}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=fd)
        try:
            os.write(f, os.urandom(size))
        finally:
            os.close(f)
        made += 1
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        break
print(made)
"""

A_WRITES = """
import errno, os, sys
d, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(d, exist_ok=True)
failed = []
for j in range(count):
    try:
        with open(os.path.join(d, f"a{j}"), "wb") as f:
            f.write(os.urandom(size))
    except OSError as e:
        failed.append(errno.errorcode.get(e.errno, str(e.errno)))
print(" ".join(failed))
"""


def test_names_deeper_than_path_max_are_evicted_like_any(shared, users):
    """Attack 7. B fills the cache with files whose paths are longer than PATH_MAX (each component
    shorter than NAME_MAX, made with descriptors). They must be evicted like any file: A's writes that
    follow still succeed, and kcache verify, with deep files still there, finds the index exact."""
    a, b = users
    m = shared(max_size="16M")
    levels = 18  # 18 * 241 bytes: 4,338, past PATH_MAX (4,096)
    made = int(as_user(b, DEEP, m.path("kcache", "bob"), levels, 16, 1 << 20, "big"))
    assert made >= 12, f"B stored only {made} deep files"
    failed = as_user(a, A_WRITES, m.path("kcache", "alice"), 8, 1 << 20).split()
    assert not failed, f"A's writes failed with {failed}: the cache is full of files eviction cannot remove"
    m.assert_within(16 << 20)
    # Deep files that stay: verify must compare them whole, not by truncated paths.
    assert int(as_user(b, DEEP, m.path("kcache", "bob"), levels, 3, 4096, "small")) == 3
    assert_index_exact(m)


# ---------------------------------------------------------------- the property: any swap, anything running
# B's worker, one process as B: for a phase, random steps with a seed. Generic files are named by their own
# inode number (kcache/bob/w/dK/<ino>, K = ino % NDIRS): A's canary holds a file of that name and that
# number for every number in a range, so that any of B's files, wherever a swap makes the daemon look,
# has a twin there. Swappable: kcache/bob/w (files), kcache/bob/p (directories eviction empties, pruned),
# sycl/bob and neo/bob (their size files, repaired under locks B holds at times), each for a symlink to
# A's tree, which has the same names below it. Swaps stay in place across phases (rebuild, verify and a
# remount see them); locks are let go at the end of each phase; the last phase puts every directory back.
NDIRS = 16
WORKER = r"""
import errno, fcntl, os, random, select, struct, sys, time
mnt, alice, seed, seconds, restore = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
NDIRS = %d
rnd = random.Random(seed)
P = lambda *a: os.path.join(mnt, *a)
SWAPS = [P("kcache", "bob", "w"), P("kcache", "bob", "p"), P("sycl", "bob"), P("neo", "bob")]
count = {}
held_sycl = []   # cache_size.txt.lock files B holds
held_neo = []    # config.file descriptors B holds a flock on
children = []

def swapped(d):
    return os.path.islink(d)

def swap(d):
    if swapped(d):
        os.unlink(d)
        os.rename(d + ".real", d)
    else:
        os.rename(d, d + ".real")
        os.symlink(alice, d)

def write_generic():
    w = P("kcache", "bob", "w")
    tmp = os.path.join(w, "new-%%d" %% rnd.randrange(1 << 30))
    with open(tmp, "wb") as f:
        f.write(os.urandom(rnd.choice((4096, 8192, 16384))))
        ino = os.fstat(f.fileno()).st_ino
    d = os.path.join(w, "d%%d" %% (ino %% NDIRS))
    os.makedirs(d, exist_ok=True)
    os.rename(tmp, os.path.join(d, str(ino)))

def write_prunable():
    e = P("kcache", "bob", "p", "x", "e%%d" %% rnd.randrange(10))
    os.makedirs(e, exist_ok=True)
    with open(os.path.join(e, "f%%d" %% rnd.randrange(4)), "wb") as f:
        f.write(os.urandom(4096))

def name_prunable():
    os.stat(P("kcache", "bob", "p", "x", "e%%d" %% rnd.randrange(10)))

def sycl_store():
    cache = P("sycl", "bob", "cache")
    k = rnd.randrange(40)
    d = os.path.join(cache, "dev0", "img%%d" %% k, "spec0", "opt0")
    os.makedirs(d, exist_ok=True)
    for suffix, data in ((".bin", os.urandom(8192)), (".src", b"key%%d" %% k), ("_access_time.txt", b"%%d" %% time.time_ns())):
        with open(os.path.join(d, "0" + suffix), "wb") as f:
            f.write(data)
    lock = os.path.join(cache, "cache_size.txt.lock")
    if lock in held_sycl:
        return
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o200))
    except FileExistsError:
        return
    with open(os.path.join(cache, "cache_size.txt"), "w") as f:
        f.write("%%d" %% rnd.randrange(1 << 20))
    if rnd.random() < 0.5:
        held_sycl.append(lock)  # kept: the daemon's repair must wait (and is kept for a later batch)
    else:
        os.unlink(lock)

def neo_store():
    cache = P("neo", "bob", "cache")
    os.makedirs(cache, exist_ok=True)
    cfg = os.path.join(cache, "config.file")
    try:
        fd = os.open(cfg, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o664)
    except FileExistsError:
        fd = os.open(cfg, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return
    tmp = os.path.join(cache, "cl_cache.%%06d" %% rnd.randrange(10 ** 6))
    with open(tmp, "wb") as f:
        f.write(os.urandom(8192))
    os.rename(tmp, os.path.join(cache, "%%016x.cl_cache" %% rnd.randrange(1 << 64)))
    os.pwrite(fd, struct.pack("=Q", rnd.randrange(1 << 20)), 0)
    if rnd.random() < 0.5:
        held_neo.append(fd)  # the flock stays: the repair waits, on the repairer thread too
    else:
        os.close(fd)

def release_one():
    if held_sycl and rnd.random() < 0.5:
        lock = held_sycl.pop(rnd.randrange(len(held_sycl)))
        os.unlink(lock)
    elif held_neo:
        os.close(held_neo.pop(rnd.randrange(len(held_neo))))

def stale_lock():
    # A lock file whose maker exited: -o stale_locks removes it when someone looks it up.
    d = P("kcache", "bob", "w", "d%%d" %% rnd.randrange(NDIRS))
    pid = os.fork()
    if pid == 0:
        try:
            os.close(os.open(os.path.join(d, "lock"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)

def look_up_lock():
    os.stat(P("kcache", "bob", "w", "d%%d" %% rnd.randrange(NDIRS), "lock"))

def read_some():
    d = P("kcache", "bob", "w", "d%%d" %% rnd.randrange(NDIRS))
    names = os.listdir(d)
    if names:
        with open(os.path.join(d, rnd.choice(names)), "rb") as f:
            f.read()

STEPS = [(write_generic, 30), (write_prunable, 8), (name_prunable, 4), (sycl_store, 8), (neo_store, 8),
         (release_one, 6), (stale_lock, 2), (look_up_lock, 3), (read_some, 8), (None, 12)]
names = [s for s, _ in STEPS]
weights = [w for _, w in STEPS]
end = time.monotonic() + seconds
while time.monotonic() < end and not select.select([sys.stdin], [], [], 0.0002)[0]:
    step = rnd.choices(names, weights)[0]
    try:
        if step is None:
            swap(rnd.choice(SWAPS))
            step = swap
        else:
            step()
    except OSError:
        pass  # ENOSPC, a name swapped away or evicted meanwhile, EACCES in A's tree: B goes on
    count[step.__name__] = count.get(step.__name__, 0) + 1
for lock in held_sycl:
    os.unlink(lock)
for fd in held_neo:
    os.close(fd)
if restore:
    for d in SWAPS:
        if swapped(d):
            swap(d)
print(" ".join("%%s=%%d" %% kv for kv in sorted(count.items())))
""" % NDIRS


def canary_tree(root, a, nfiles):
    """A's private tree below root, with every name a swap can make the daemon look for: dK/<ino> files
    of their own inode numbers (nfiles of them, numbers in sequence), SYCL's and NEO's size files,
    directories x/eI that are empty, as B's emptied ones are."""
    canary_dir(root, a)
    for k in range(NDIRS):
        canary_dir(os.path.join(root, f"d{k}"), a)
    tmp = os.path.join(root, ".t")
    for _ in range(nfiles):
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        ino = os.fstat(fd).st_ino
        os.fchown(fd, a.pw_uid, a.pw_gid)
        os.close(fd)
        os.rename(tmp, os.path.join(root, f"d{ino % NDIRS}", str(ino)))
    canary_dir(os.path.join(root, "cache"), a)
    canary_file(os.path.join(root, "cache", "cache_size.txt"), a, b"123456")
    canary_file(os.path.join(root, "cache", "config.file"), a, struct.pack("=Q", 0x5EC12E7))
    canary_file(os.path.join(root, "cache", "0123456789abcdef.cl_cache"), a, os.urandom(8192))
    for i in range(10):
        canary_dir(os.path.join(root, "x", f"e{i}"), a)
    canary_file(os.path.join(root, "x", "notes"), a, b"A's notes\n")


@pytest.mark.timeout(900)
def test_symlink_swaps_never_reach_outside(shared, canary_fs, users):
    """The property behind attacks 1-3: whatever directories of his B swaps for symlinks to A's tree (on
    another filesystem, with inode numbers made to collide), and whenever, while eviction (a 4 MiB
    cache, filled all the time), repairs (SYCL and NEO, under locks B holds at times), pruning, the stale
    lock reaper, kcache verify and the index's rebuild (kcache verify --repair; a remount with -o
    rebuild) run, nothing of A's changes, and the index stays exact. About 60 s (KCACHEFS_ATTACK_SECONDS),
    in phases; the seed is printed (KCACHEFS_ATTACK_SEED repeats a run)."""
    a, b = users
    m = shared(max_size="4M", stale_locks=True, timeout="0.2")
    alice = os.path.join(canary_fs, "alice")
    canary_tree(alice, a, 1500 * int(attack_seconds(60)) + 20000)  # more numbers than the backing gives out
    before = snapshot(canary_fs)
    as_user(b, "import os, sys\nfor d in sys.argv[1:]: os.makedirs(d)",
            m.path("kcache", "bob", "w"), m.path("kcache", "bob", "p"), m.path("sycl", "bob", "cache"),
            m.path("neo", "bob", "cache"))
    seed = attack_seed()
    rnd = random.Random(seed)
    total = attack_seconds(60)
    phases = max(2, round(total / 12))
    for phase in range(phases):
        last = phase == phases - 1
        worker = spawn_as(b, WORKER, m.mnt, alice, rnd.randrange(1 << 30), total / phases, "1" if last else "0")
        # While B works: root verifies (a walk of the backing tree) and, in odd phases, repairs the index.
        kcache("verify", m.mnt, check=False)
        try:
            worker.wait(timeout=total / phases + 120)  # it ends by itself when its phase is over
        finally:
            out = finish(worker)
        assert worker.returncode == 0, "B's worker failed"
        print(f"phase {phase}: {out.strip()}")
        assert_canary_intact(canary_fs, before)
        if last:
            break
        if phase % 2:
            kcache("verify", "--repair", m.mnt, check=False)
        else:  # with B's symlinks in place: the rebuild must not follow them either
            m.stop()
            m.opts["rebuild"] = True
            m.start()
            del m.opts["rebuild"]
        assert_canary_intact(canary_fs, before)
    # The repairs and prunes still pending run at the next batches; then nothing of A's may have changed.
    evict_all(m)
    evict_all(m)
    assert_canary_intact(canary_fs, before)
    top = max(os.stat(n, dir_fd=dfd, follow_symlinks=False).st_ino
              for _, _, fns, dfd in os.fwalk(m.backing) for n in fns)
    print(f"the backing's inode numbers reached {top}; A's twins cover up to {max(e[4] for e in before.values())}")
    evicted = int(os.getxattr(m.mnt, "user.kcachefs.evicted_files"))  # since the last mount
    assert evicted > 100, f"only {evicted} files evicted since the last mount: the property was hardly tried"
    assert_index_exact(m)
    assert_canary_intact(canary_fs, before)
