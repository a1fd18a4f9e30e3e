"""Exact to the block on ext4, and never above max_size, whatever allocates behind a write's measurement:
an extended attribute that spills out of the inode into a block of its own (ops-xattr.c, ATTRIBUTES TAKE
BLOCKS), and the extent blocks that writeback allocates after the daemon measured a write, which the kernel
allocates even after the daemon was killed (settle.c, MARGIN). Each case on an ext4 loop image, where tmpfs
would show nothing: tmpfs has neither attribute blocks nor writeback."""
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


def strided_files(m, n, writes):
    """n files of `writes` 4 KiB writes at 8 KiB strides: an extent each, more than the inode holds, so
    that ext4 allocates an extent block for each file at writeback, after the daemon measured it."""
    for i in range(n):
        fd = os.open(m.path(f"f{i}"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for j in range(writes):
                os.pwrite(fd, b"s" * 4096, j * 8192)
        finally:
            os.close(fd)


def test_a_sigkill_leaves_the_tree_within_max_size(kfs):
    """Through a 4 MiB cache, 40 files whose writeback allocates an extent block each; the daemon is killed
    right after the last write, before anything measured them after writeback. The kernel writes them back
    all the same: the tree must have had room for those blocks. Before, it held 122,880 bytes more than
    max_size after sync (4 KiB blocks)."""
    limit = 4 << 20
    m = kfs({"max_size": "4M", "grace_ms": "0", "low_watermark": "100"}, fs="ext4", tmpfs_size="600m")
    strided_files(m, 40, 30)
    assert int(os.getxattr(m.mnt, "user.kcachefs.evicted_files")) > 0, "the limit was never reached"
    m.kill()
    subprocess.run(["sync"], check=True)
    tree = backing_bytes(m.backing)
    assert tree <= limit, f"after a SIGKILL and sync the tree holds {tree} bytes, {tree - limit} over max_size"


def test_the_writeback_margin_is_given_back(kfs):
    """What a write reserves for its writeback goes once the file is measured after it: the cache fills to
    its limit as before, and the count equals the tree, also after a remount (1 KiB blocks this time)."""
    m = kfs({"max_size": "4M", "grace_ms": "0", "low_watermark": "100"}, fs="ext4")
    strided_files(m, 40, 30)
    rc, out = verify(m)  # which measures every written file after its writeback first
    assert rc == 0, out
    # Nothing is held back any more: a file that takes the room left (less its own margin: 16 KiB is more
    # than the margins of its writes) is written without eviction; the 40 files' margins, had they stayed,
    # came to over 200 KiB.
    free = (4 << 20) - m.used() - (16 << 10)
    evicted = int(os.getxattr(m.mnt, "user.kcachefs.evicted_files"))
    with open(m.path("last"), "wb") as f:
        f.write(b"l" * (free // 4096 * 4096))
    assert int(os.getxattr(m.mnt, "user.kcachefs.evicted_files")) == evicted, "the margins were never given back"
    exact(m, "extent blocks allocated at writeback")


def test_the_limit_holds_through_a_shared_writable_mapping(kfs):
    """A new file mapped shared and writable: the pages written through the mapping reach the backing file
    only through the daemon (WRITE requests at writeback, each reserved), never by a mapping of the
    backing file itself, which would allocate what no reservation saw. (A created file in passthrough mode
    with a read-write backing file broke this: 8 MiB on the disk under a 1 MiB limit.)"""
    import mmap
    m = kfs({"max_size": "1M"})
    fd = os.open(m.path("mapped"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.ftruncate(fd, 8 << 20)
        try:
            mm = mmap.mmap(fd, 8 << 20, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            mm = None  # refusing the mapping keeps the limit too
        if mm is not None:
            for off in range(0, 8 << 20, 4096):
                mm[off] = 1
            try:
                mm.flush()  # writeback: the daemon refuses what does not fit (ENOSPC)
            except OSError:
                pass
            mm.close()
        try:
            os.fsync(fd)
        except OSError:
            pass
    finally:
        os.close(fd)
    m.assert_within(1 << 20)
