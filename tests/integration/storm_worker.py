"""One process of the crash storm (test_reliability.py): a mixed workload on its own subtree of the mount,
with a log of what it committed, written outside the mount, one line per event, flushed at once:

    I <name> <ns> <ino>    about to rename a new version (inode <ino>) over <name> (outcome unknown until C)
    C <name> <sha> <ns> <ino>  the rename returned: <name> holds that file, whose checksum is <sha>
    D <name> <ns>          about to unlink <name>
    U <name> <ns>          the unlink returned
    T <name>               a read found <name> torn: its own checksum does not match

Every file is its content followed by the SHA-256 of that content, so any reader can tell a torn file.
Errors (the daemon is being killed, the cache is full) are expected: the worker waits a moment and goes on.

    storm_worker.py MOUNT ID LOG SEED
"""
import hashlib
import os
import random
import sys
import time


def main():
    mnt, wid, log_path, seed = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    rnd = random.Random(seed)
    top = os.path.join(mnt, f"w{wid}")
    log = open(log_path, "a", buffering=1)
    n = 0
    while True:
        n += 1
        name = f"w{wid}/f{rnd.randrange(24)}"
        path = os.path.join(mnt, name)
        op = rnd.random()
        try:
            os.makedirs(top, exist_ok=True)
            if op < 0.45:  # create or overwrite through a temporary file and a rename
                data = rnd.randbytes(rnd.choice((512, 4096, 20000, 65536)))
                digest = hashlib.sha256(data).digest()
                tmp = os.path.join(top, f".tmp-{n}")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    os.write(fd, data + digest)
                    ino = os.fstat(fd).st_ino  # the backing inode: what the eviction log records
                finally:
                    os.close(fd)
                log.write(f"I {name} {time.time_ns()} {ino}\n")
                os.rename(tmp, path)
                log.write(f"C {name} {digest.hex()} {time.time_ns()} {ino}\n")
            elif op < 0.80:  # read and verify
                with open(path, "rb") as f:
                    blob = f.read()
                if len(blob) < 32 or hashlib.sha256(blob[:-32]).digest() != blob[-32:]:
                    log.write(f"T {name}\n")
            elif op < 0.90:
                log.write(f"D {name} {time.time_ns()}\n")
                os.unlink(path)
                log.write(f"U {name} {time.time_ns()}\n")
            else:  # directories come and go
                d = os.path.join(top, f"d{rnd.randrange(4)}")
                if rnd.random() < 0.5:
                    os.mkdir(d)
                else:
                    os.rmdir(d)
        except OSError:
            time.sleep(0.005)


if __name__ == "__main__":
    main()
