"""Exact to the block on ext4, whatever allocates behind a write's measurement: an extended attribute that
spills out of the inode into a block of its own (ops-xattr.c, ATTRIBUTES TAKE BLOCKS). On an ext4 loop
image, where tmpfs would show nothing: tmpfs has no attribute blocks."""
import os
import subprocess

from conftest import ROOT, backing_bytes, backing_files

KCACHE = os.environ.get("KCACHE_BIN") or os.path.join(ROOT, "build", "kcache")


def verify(m):
    """kcache verify after sync: the index against the tree (st_blocks * 512 of each regular file)."""
    subprocess.run(["sync"], check=True)
    v = subprocess.run([KCACHE, "verify", m.mnt], capture_output=True, text=True)
    return v.returncode, v.stdout + v.stderr


def exact(m, what):
    """The index equals the tree: by kcache verify while mounted, in the index's rows after a clean
    unmount, and by kcache verify again after the remount."""
    rc, out = verify(m)
    assert rc == 0, f"{what}: {out}"
    assert m.used() == backing_bytes(m.backing), what
    m.stop()
    rows, tree = m.index_rows(), backing_files(m.backing)
    assert rows == tree, f"{what}: after a clean unmount the index holds {rows}, the tree {tree}"
    m.start()
    rc, out = verify(m)
    assert rc == 0, f"{what}, after the remount: {out}"


def blocks(m, name):
    return os.lstat(os.path.join(m.backing, name)).st_blocks * 512


def test_an_attribute_that_takes_a_block_is_counted(kfs):
    m = kfs({"max_size": "64M"}, fs="ext4")
    # A 0-byte file given an attribute too big for its inode: ext4 puts it in a block of its own, which the
    # index did not count ("index 0 bytes, tree 1024", 4096 with 4 KiB blocks).
    open(m.path("f"), "wb").close()
    os.setxattr(m.path("f"), "user.big", b"x" * 300)
    assert blocks(m, "f") > 0, "the attribute did not take a block: the test shows nothing"
    exact(m, "an attribute block")
    # Its removal frees the block: the index must not keep it.
    os.removexattr(m.path("f"), "user.big")
    assert blocks(m, "f") == 0
    exact(m, "an attribute block freed")


def test_a_pin_that_takes_a_block_is_counted(kfs):
    """The daemon's own attribute, the pin it keeps on the backing file (control.c, PINS), spills the same
    way when the inode's room is taken: a user attribute that fits alone, and the pin that does not fit
    beside it."""
    m = kfs({"max_size": "64M"}, fs="ext4")
    open(m.path("f"), "wb").close()
    os.setxattr(m.path("f"), "user.f", b"x" * 48)
    assert blocks(m, "f") == 0, "the user attribute alone took a block: the test shows nothing"
    os.setxattr(m.path("f"), "user.kcachefs.pinned", b"1")
    assert blocks(m, "f") > 0, "the pin did not take a block: the test shows nothing"
    exact(m, "a pin's attribute block")
    os.setxattr(m.path("f"), "user.kcachefs.pinned", b"0")
    exact(m, "a pin's attribute block freed")
