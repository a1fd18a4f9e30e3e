"""One process of the accounting stress test (test_accounting_stress.py): random operations of every kind
the daemon accounts, on its own subtree and on a directory all workers share, until a deadline.

    ops_worker.py MOUNT ID SEED SECONDS

Every operation may fail the way a cache under eviction makes it fail (the file was evicted: ENOENT or
ESTALE; the cache is full of young or open files: ENOSPC; another worker removed a directory: ENOTEMPTY)
and the worker goes on; any other error ends it with a traceback and a non-zero status. It prints the
number of operations of each kind it completed, as one JSON line."""
import ctypes
import errno
import json
import mmap
import os
import random
import sys
import time

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10
EXPECTED = {errno.ENOENT, errno.ESTALE, errno.ENOSPC, errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY,
            errno.ENOTDIR, errno.EISDIR}

libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


def fallocate(fd, mode, off, length):
    if libc.fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class Worker:
    def __init__(self, mnt, wid, seed):
        self.rnd = random.Random(seed)
        self.mine = os.path.join(mnt, f"w{wid}")
        self.shared = os.path.join(mnt, "shared")
        self.wid = wid
        self.n = 0
        self.done = {}

    def path(self):
        r = self.rnd
        base = self.shared if r.random() < 0.3 else self.mine
        sub = r.choice(("", "a", "a/b", "c"))
        return os.path.join(base, sub, f"f{r.randrange(12)}")

    def data(self):
        return self.rnd.randbytes(self.rnd.choice((100, 4096, 5000, 65536, 200000)))

    def op_create(self):
        p = self.path()
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(self.data())

    def op_pwrite(self):
        fd = os.open(self.path(), os.O_WRONLY)
        try:
            os.pwrite(fd, self.data(), self.rnd.randrange(0, 1 << 20))
        finally:
            os.close(fd)

    def op_strided(self):  # small writes with holes between: ext4 allocates extent blocks at writeback
        fd = os.open(self.path(), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for i in range(self.rnd.randrange(8, 200)):
                os.pwrite(fd, b"s" * 4096, i * 8192)
        finally:
            os.close(fd)

    def op_truncate(self):
        os.truncate(self.path(), self.rnd.choice((0, 0, 1, 4095, 4096, 100000, 1 << 20)))

    def op_fallocate(self):
        fd = os.open(self.path(), os.O_WRONLY)
        try:
            mode = self.rnd.choice((0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                    FALLOC_FL_ZERO_RANGE, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE))
            fallocate(fd, mode, self.rnd.randrange(0, 1 << 19), self.rnd.choice((4096, 65536, 262144)))
        finally:
            os.close(fd)

    def op_copy_range(self):
        src = os.open(self.path(), os.O_RDONLY)
        try:
            dst = os.open(self.path(), os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                if os.fstat(src).st_ino == os.fstat(dst).st_ino:
                    return  # one file (or two links of it): overlapping ranges are EINVAL
                os.copy_file_range(src, dst, self.rnd.randrange(1, 300000), 0, self.rnd.randrange(0, 1 << 18))
            finally:
                os.close(dst)
        finally:
            os.close(src)

    def op_mmap(self):
        # Its own files only, and only one with no other name: a shared file, or one linked or renamed in
        # from the shared directory, may be truncated under the mapping by another worker (SIGBUS, as
        # POSIX says).
        fd = os.open(self.path().replace(self.shared, self.mine), os.O_RDWR)
        try:
            st = os.fstat(fd)
            size = st.st_size
            if size == 0 or st.st_nlink != 1:
                return
            with mmap.mmap(fd, size) as m:
                off = self.rnd.randrange(0, size)
                n = min(size - off, 20000)
                m[off:off + n] = b"m" * n
                m.flush()
        finally:
            os.close(fd)

    def op_direct(self):
        p = self.path()
        os.makedirs(os.path.dirname(p), exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
        try:
            n = self.rnd.choice((4096, 65536))
            buf = mmap.mmap(-1, n)  # page-aligned
            buf.write(self.rnd.randbytes(n))
            os.pwrite(fd, buf, self.rnd.randrange(0, 64) * 4096)
            buf.close()
        finally:
            os.close(fd)

    def op_link(self):
        a, b = self.path(), self.path()
        if a != b:
            os.makedirs(os.path.dirname(b), exist_ok=True)
            os.link(a, b)

    def op_rename(self):
        a, b = self.path(), self.path()
        os.makedirs(os.path.dirname(b), exist_ok=True)
        os.rename(a, b)

    def op_rename_over_open(self):
        a, b = self.path(), self.path()
        if a == b:
            return
        with open(b, "rb") as held:
            os.rename(a, b)
            held.read(4096)  # the replaced file stays readable while open

    def op_unlink(self):
        os.unlink(self.path())

    def op_dirs(self):
        d = os.path.join(self.rnd.choice((self.mine, self.shared)), self.rnd.choice(("a", "a/b", "c", "e")))
        if self.rnd.random() < 0.5:
            os.makedirs(d, exist_ok=True)
        else:
            os.rmdir(d)

    def op_read(self):
        with open(self.path(), "rb") as f:
            f.read()

    def run(self, seconds):
        ops = [(name[3:], getattr(self, name)) for name in dir(self) if name.startswith("op_")]
        os.makedirs(self.mine, exist_ok=True)
        os.makedirs(self.shared, exist_ok=True)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            name, fn = self.rnd.choice(ops)
            try:
                fn()
                self.done[name] = self.done.get(name, 0) + 1
            except OSError as e:
                if e.errno not in EXPECTED:
                    raise


def main():
    mnt, wid, seed, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    w = Worker(mnt, wid, seed)
    w.run(seconds)
    print(json.dumps(w.done))


if __name__ == "__main__":
    main()
