"""POSIX behaviour, the same checks on the raw backing filesystem and on the mount. Each check records
an outcome (a value, or the errno it met); the mount must give the same outcome as the raw directory for
every one. Covers open flags, rename variants, link counts, permissions and ownership under
allow_other,default_permissions, timestamps other than atime, xattrs, flock and fcntl locks, mmap, large
files, long names, symlinks, holes, special files and listings."""
import errno
import fcntl
import mmap
import os
import stat
import subprocess
import time

import pytest

from conftest import ensure_user, mount_tmpfs


def outcome(fn):
    try:
        r = fn()
        return ("ok", r)
    except OSError as e:
        return ("errno", errno.errorcode.get(e.errno, e.errno))


def suite(d, other_user):
    """{check: outcome} for directory D."""
    os.umask(0o022)
    res = {}

    def check(name, fn):
        res[name] = outcome(fn)

    def p(*parts):
        return os.path.join(d, *parts)

    def write(path, data, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode=0o644):
        fd = os.open(path, flags, mode)
        try:
            return os.write(fd, data)
        finally:
            os.close(fd)

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    write(p("f"), b"hello")
    # open flags
    check("excl on existing", lambda: os.close(os.open(p("f"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)))
    check("excl new", lambda: os.close(os.open(p("g"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)) or
          oct(os.stat(p("g")).st_mode & 0o777))
    check("trunc", lambda: write(p("f"), b"", os.O_WRONLY | os.O_TRUNC) or os.path.getsize(p("f")))
    write(p("f"), b"hello")
    check("append", lambda: write(p("f"), b" world", os.O_WRONLY | os.O_APPEND) and read(p("f")))
    check("directory flag on a file", lambda: os.close(os.open(p("f"), os.O_RDONLY | os.O_DIRECTORY)))
    os.symlink("f", p("ln"))
    check("nofollow on a symlink", lambda: os.close(os.open(p("ln"), os.O_RDONLY | os.O_NOFOLLOW)))
    def on_fd(path, flags, fn):
        fd = os.open(path, flags)
        try:
            return fn(fd)
        finally:
            os.close(fd)
    check("write on read-only fd", lambda: on_fd(p("f"), os.O_RDONLY, lambda fd: os.write(fd, b"x")))
    check("read on write-only fd", lambda: on_fd(p("f"), os.O_WRONLY, lambda fd: os.read(fd, 1)))
    check("open missing", lambda: os.open(p("missing"), os.O_RDONLY))
    check("creat in missing dir", lambda: os.open(p("nodir", "x"), os.O_CREAT | os.O_WRONLY))
    check("open dir for writing", lambda: os.open(d, os.O_WRONLY))
    # symlinks
    check("readlink", lambda: os.readlink(p("ln")))
    check("follow", lambda: read(p("ln")))
    os.symlink("nowhere", p("dangling"))
    check("dangling", lambda: read(p("dangling")))
    check("lstat dangling", lambda: stat.S_ISLNK(os.lstat(p("dangling")).st_mode))
    # rename variants
    write(p("a"), b"A")
    write(p("b"), b"B")
    check("rename over a file", lambda: os.rename(p("a"), p("b")) or read(p("b")))
    os.makedirs(p("d1", "sub"))
    os.makedirs(p("d2"))
    os.makedirs(p("d3"))
    check("rename dir over empty dir", lambda: os.rename(p("d2"), p("d3")) or sorted(os.listdir(d)).count("d3"))
    check("rename dir over non-empty dir", lambda: os.rename(p("d3"), p("d1")))
    check("rename file over dir", lambda: os.rename(p("b"), p("d1")))
    check("rename dir over file", lambda: os.rename(p("d3"), p("b")))
    check("rename into own subdir", lambda: os.rename(p("d1"), p("d1", "sub", "x")))
    check("rename to itself", lambda: os.rename(p("b"), p("b")) or read(p("b")))
    check("rename missing", lambda: os.rename(p("nope"), p("b2")))
    libc = __import__("ctypes").CDLL(None, use_errno=True)

    def renameat2(a, b, flags):
        r = libc.renameat2(-100, a.encode(), -100, b.encode(), flags)
        if r:
            e = __import__("ctypes").get_errno()
            raise OSError(e, os.strerror(e))
    write(p("x"), b"X")
    write(p("y"), b"Y")
    check("rename noreplace", lambda: renameat2(p("x"), p("y"), 1))
    check("rename exchange", lambda: renameat2(p("x"), p("y"), 2) or (read(p("x")), read(p("y"))))
    check("rename noreplace to new", lambda: renameat2(p("x"), p("x2"), 1) or read(p("x2")))
    # link counts
    write(p("h"), b"hard")
    check("link", lambda: os.link(p("h"), p("h2")) or os.stat(p("h")).st_nlink)
    check("link to existing", lambda: os.link(p("h"), p("h2")))
    check("link count after unlink", lambda: os.unlink(p("h2")) or os.stat(p("h")).st_nlink)
    check("dir link count", lambda: os.stat(p("d1")).st_nlink)
    check("rmdir non-empty", lambda: os.rmdir(p("d1")))
    check("rmdir a file", lambda: os.rmdir(p("h")))
    check("unlink a dir", lambda: os.unlink(p("d3")))
    check("mkdir existing", lambda: os.mkdir(p("d1")))
    # permissions and ownership
    write(p("priv"), b"secret", mode=0o600)
    os.chmod(p("priv"), 0o600)
    check("chmod", lambda: os.chmod(p("f"), 0o751) or oct(os.stat(p("f")).st_mode & 0o7777))
    check("chmod setgid sticky", lambda: os.chmod(p("d1"), 0o3775) or oct(os.stat(p("d1")).st_mode & 0o7777))
    check("chown", lambda: os.chown(p("f"), 1234, 5678) or (os.stat(p("f")).st_uid, os.stat(p("f")).st_gid))
    check("chown symlink itself", lambda: os.lchown(p("ln"), 4321, 4321) or os.lstat(p("ln")).st_uid)
    check("access as root", lambda: os.access(p("priv"), os.R_OK))
    u = other_user
    r = subprocess.run(["runuser", "-u", u, "--", "cat", p("priv")], capture_output=True, text=True)
    res["other user reads 0600"] = ("rc", r.returncode, "Permission denied" in r.stderr)
    os.chmod(d, 0o755)
    r = subprocess.run(["runuser", "-u", u, "--", "touch", p("by-other")], capture_output=True, text=True)
    res["other user creates in 0755 dir"] = ("rc", r.returncode)
    os.chmod(d, 0o1777)
    r = subprocess.run(["runuser", "-u", u, "--", "sh", "-c", f"echo x > {p('by-other')} && stat -c %U {p('by-other')}"],
                       capture_output=True, text=True)
    res["other user creates in 1777 dir"] = ("rc", r.returncode, r.stdout.strip())
    r = subprocess.run(["runuser", "-u", u, "--", "rm", "-f", p("f")], capture_output=True, text=True)
    res["other user removes root's file, sticky"] = ("rc", r.returncode)
    # timestamps other than atime
    check("utime mtime", lambda: os.utime(p("h"), ns=(1_000_000_000, 2_000_000_123)) or os.stat(p("h")).st_mtime_ns)
    before = os.stat(p("h"))
    time.sleep(0.02)
    check("write moves mtime", lambda: write(p("h"), b"new", os.O_WRONLY) and os.stat(p("h")).st_mtime_ns > before.st_mtime_ns)
    c0 = os.stat(p("h")).st_ctime_ns
    time.sleep(0.02)
    check("chmod moves ctime", lambda: os.chmod(p("h"), 0o640) or os.stat(p("h")).st_ctime_ns > c0)
    m0 = os.stat(p("d1")).st_mtime_ns
    time.sleep(0.02)
    check("create moves dir mtime", lambda: write(p("d1", "new"), b"") == 0 and os.stat(p("d1")).st_mtime_ns > m0)
    # xattrs
    check("setxattr", lambda: os.setxattr(p("h"), "user.test", b"v1") or os.getxattr(p("h"), "user.test"))
    check("xattr create existing", lambda: os.setxattr(p("h"), "user.test", b"v2", os.XATTR_CREATE))
    check("xattr replace missing", lambda: os.setxattr(p("h"), "user.none", b"v", os.XATTR_REPLACE))
    check("getxattr missing", lambda: os.getxattr(p("h"), "user.none"))
    check("listxattr", lambda: sorted(a for a in os.listxattr(p("h")) if a.startswith("user.test")))
    check("removexattr", lambda: os.removexattr(p("h"), "user.test") or os.listxattr(p("h")).count("user.test"))
    check("removexattr missing", lambda: os.removexattr(p("h"), "user.test"))
    # locks
    fd1, fd2 = os.open(p("h"), os.O_RDWR), os.open(p("h"), os.O_RDWR)
    check("flock exclusive", lambda: fcntl.flock(fd1, fcntl.LOCK_EX | fcntl.LOCK_NB))
    check("flock conflict", lambda: fcntl.flock(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB))
    check("flock shared conflict", lambda: fcntl.flock(fd2, fcntl.LOCK_SH | fcntl.LOCK_NB))
    fcntl.flock(fd1, fcntl.LOCK_UN)
    check("flock after unlock", lambda: fcntl.flock(fd2, fcntl.LOCK_SH | fcntl.LOCK_NB))
    os.close(fd1)
    os.close(fd2)
    fd = os.open(p("h"), os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)
    code = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
            "try:\n    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)\n    print('got')\n"
            "except OSError as e:\n    print(e.errno)\n"
            "fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 20)\nprint('other range ok')\n")
    r = subprocess.run(["/usr/bin/python3", "-c", code, p("h")], capture_output=True, text=True)
    res["fcntl lock conflict and other range"] = ("out", r.stdout.split())
    os.close(fd)
    # mmap
    write(p("mm"), b"\0" * 8192)
    fd = os.open(p("mm"), os.O_RDWR)
    mm = mmap.mmap(fd, 8192, mmap.MAP_SHARED)
    mm[100:105] = b"shard"
    mm.flush()
    check("mmap shared write seen by read", lambda: read(p("mm"))[100:105])
    mp = mmap.mmap(fd, 8192, mmap.MAP_PRIVATE)
    mp[200:205] = b"privt"
    check("mmap private write not seen", lambda: read(p("mm"))[200:205])
    mm.close()
    mp.close()
    os.close(fd)
    # large files, holes
    fd = os.open(p("big"), os.O_RDWR | os.O_CREAT, 0o644)
    check("write at 5 GiB", lambda: os.pwrite(fd, b"end", 5 << 30) and os.fstat(fd).st_size)
    check("read at 5 GiB", lambda: os.pread(fd, 3, 5 << 30))
    check("read in the hole", lambda: os.pread(fd, 4, 1 << 30))
    check("seek data", lambda: os.lseek(fd, 0, os.SEEK_DATA))
    check("seek hole", lambda: os.lseek(fd, 0, os.SEEK_HOLE))
    check("seek end", lambda: os.lseek(fd, 0, os.SEEK_END))
    os.close(fd)
    check("truncate extend", lambda: os.truncate(p("h"), 100000) or os.path.getsize(p("h")))
    check("truncate shrink", lambda: os.truncate(p("h"), 2) or read(p("h")))
    # names
    check("name of 255", lambda: write(p("n" * 255), b"") == 0 and len(os.listdir(d)) > 0)
    check("name of 256", lambda: write(p("n" * 256), b""))
    check("utf-8 name", lambda: write(p("ünïcødé-名前"), b"u") and read(p("ünïcødé-名前")))
    deep = p(*["deep"] * 30)
    check("deep path", lambda: os.makedirs(deep) or write(os.path.join(deep, "leaf"), b"x"))
    # special files
    check("mkfifo", lambda: os.mkfifo(p("fifo")) or stat.S_ISFIFO(os.stat(p("fifo")).st_mode))
    check("mknod char as root", lambda: os.mknod(p("null"), 0o666 | stat.S_IFCHR, os.makedev(1, 3)) or
          stat.S_ISCHR(os.stat(p("null")).st_mode))
    def bind_socket():
        s = __import__("socket").socket(__import__("socket").AF_UNIX)
        try:
            s.bind(p("sock"))
        finally:
            s.close()
        return stat.S_ISSOCK(os.stat(p("sock")).st_mode)
    check("unix socket", bind_socket)
    # listings
    check("listdir", lambda: sorted(os.listdir(d)))
    check("scandir types", lambda: sorted((e.name, e.is_dir(follow_symlinks=False), e.is_symlink())
                                          for e in os.scandir(d)))
    check("sizes", lambda: sorted((n, os.lstat(p(n)).st_size) for n in os.listdir(d)
                                  if not stat.S_ISDIR(os.lstat(p(n)).st_mode)))
    return res


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, mknod, another user)")
def test_mount_behaves_as_the_raw_directory(kfs, workdir):
    d, cleanup = workdir
    ensure_user("kcfs-posix")
    raw = os.path.join(d, "raw")
    mount_tmpfs(raw, "256m")
    cleanup.insert(0, raw)
    os.chmod(raw, 0o755)
    m = kfs({"allow_other": True, "default_permissions": True, "max_size": "128M"})
    os.makedirs(os.path.join(raw, "t"))
    os.makedirs(m.path("t"))
    want = suite(os.path.join(raw, "t"), "kcfs-posix")
    got = suite(m.path("t"), "kcfs-posix")
    assert len(want) > 75
    differ = {k: (want[k], got.get(k)) for k in want if got.get(k) != want[k]}
    assert not differ, "\n".join(f"{k}: raw {w} / mount {g}" for k, (w, g) in differ.items())
