"""Memory follows the cache, not the evictions (fs/kprune.c): an evicted name is dropped from the kernel's
cache once nobody uses it, so the kernel forgets its inode and the daemon frees what it kept for it."""
import errno
import os
import platform

import pytest

from conftest import wait_for


def counts(m):
    return {k: int(os.getxattr(m.mnt, "user.kcachefs." + k)) for k in
            ("files", "evicted_files", "inodes", "detached_inodes", "pruned_names")}


def kernel_prunes():
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return (major, minor) >= (6, 18)


@pytest.mark.parametrize("transport", ["uring", "nouring"])
def test_evicted_names_are_forgotten_by_the_kernel_and_the_daemon(kfs, transport):
    if not kernel_prunes():
        pytest.skip("FUSE_NOTIFY_PRUNE needs Linux 6.18")
    opts = {"max_size": "1M", "grace_ms": "0", "protect": "writers"}
    if transport == "nouring":
        opts["nouring"] = True
    m = kfs(opts)
    os.mkdir(m.path("d"))
    n = 4000
    for i in range(n):
        with open(m.path("d", f"f{i}"), "wb") as f:
            f.write(b"x" * 4096)
    c = counts(m)
    assert c["evicted_files"] >= n - 300, c
    # every name evicted is pruned (the descent sends its batch's once it has released its locks)
    wait_for(lambda: counts(m)["pruned_names"] >= counts(m)["evicted_files"], timeout=10, what="the prunes")
    # The kernel queues its FORGETs and sends them between requests; once they are in, the daemon keeps
    # only the cache's inodes, whatever number of files went through it.
    wait_for(lambda: counts(m)["detached_inodes"] < 100, timeout=30, what="the kernel's forgets")
    c = counts(m)
    assert c["inodes"] <= c["files"] + 10, c
    # An evicted file still open (protect=writers lets a reader's file go) keeps its name until it is
    # closed, then goes too: the last close prunes it.
    wait_for(lambda: counts(m)["detached_inodes"] == 0, timeout=30, what="every forget")
    with open(m.path("d", "held"), "wb") as f:
        f.write(b"y" * 4096)
    held = open(m.path("d", "held"), "rb")
    for i in range(n, n + 400):
        with open(m.path("d", f"f{i}"), "wb") as f:
            f.write(b"x" * 4096)
    # evicted while open: asked through the open file (a lookup of its name would drop the name itself),
    # the daemon answers ESTALE for an evicted inode's attributes
    with pytest.raises(OSError) as e:
        os.getxattr(held.fileno(), "user.kcachefs.inode")
    assert e.value.errno == errno.ESTALE
    assert held.read() == b"y" * 4096
    wait_for(lambda: counts(m)["detached_inodes"] == 1, timeout=30, what="every forget but the open file's")
    held.close()
    wait_for(lambda: counts(m)["detached_inodes"] == 0, timeout=30, what="the forget after the close")
