"""What an operator meets at the edges: a cache over its limit at mount, a mount point already mounted,
bad options, a remount right after an unmount, a missing mount point, and where a detached daemon's
messages go."""
import os
import signal
import socket
import subprocess
import time

import pytest

from conftest import kcachefs_bin, wait_for


def test_a_cache_over_its_limit_at_mount_comes_down_once_its_files_age(kfs):
    m = kfs({"max_size": "8M"})
    for i in range(6):
        with open(m.path(f"f{i}"), "wb") as f:
            f.write(os.urandom(1 << 20))
    m.stop()
    # Remounted smaller, with a grace period the files are still inside: nothing may go at first, and no
    # write will come to kick the descent again.
    m.opts.update({"max_size": "2M", "grace_ms": "1500"})
    m.start()
    assert m.used() > 2 << 20
    wait_for(lambda: m.used() <= 2 << 20, timeout=15, what="the cache down to its limit with no write coming")
    m.assert_within(2 << 20)


def test_a_mount_point_with_a_mount_is_refused(kfs, workdir):
    first = kfs()
    with open(first.path("kept"), "w") as f:
        f.write("first cache")
    other = os.path.join(workdir[0], "other-backing")
    os.makedirs(other)
    p = subprocess.run([kcachefs_bin(), other, first.mnt], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "has a mount already" in lines[0], p.stderr
    assert open(first.path("kept")).read() == "first cache"  # the first cache is still what is mounted
    assert not os.path.exists(os.path.join(other, ".kcachefs"))


def test_bad_options_change_nothing(workdir):
    d, _ = workdir
    backing, mnt = os.path.join(d, "b"), os.path.join(d, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    for opts in ("no_such_option", "max_size=12Q", "low_watermark=150", "entry_timeout=abc"):
        p = subprocess.run([kcachefs_bin(), "-o", opts, backing, mnt], capture_output=True, text=True, timeout=60)
        assert p.returncode != 0, opts
        assert os.listdir(backing) == [], f"-o {opts} left {os.listdir(backing)} in the backing directory"
        assert not os.path.ismount(mnt)
        assert "kcachefs:" in p.stderr, p.stderr


def test_a_missing_mount_point_says_so_in_one_line(workdir):
    d, _ = workdir
    backing = os.path.join(d, "b")
    os.makedirs(backing)
    p = subprocess.run([kcachefs_bin(), backing, os.path.join(d, "nowhere")], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0
    assert p.stderr.strip().splitlines() == [f"kcachefs: mount point '{os.path.join(d, 'nowhere')}': does not exist"]
    assert os.listdir(backing) == []


def test_a_remount_right_after_an_unmount_waits_for_the_old_daemon(kfs):
    m = kfs({"max_size": "64M"})
    for r in range(20):
        with open(m.path(f"f{r}"), "wb") as f:
            f.write(os.urandom(300000))  # something to flush at each unmount
        subprocess.run(["fusermount3", "-u", m.mnt], check=True)  # returns before the daemon has exited
        p = m.start(check=False)
        assert p.returncode == 0, f"round {r}: {p.stderr}"
        wait_for(lambda: os.path.ismount(m.mnt), what="mount")
        assert "did not stop cleanly" not in p.stderr, p.stderr
    assert sorted(os.listdir(m.mnt)) == sorted(f"f{r}" for r in range(20))


def test_a_remount_waits_for_a_daemon_that_has_not_yet_noticed_its_unmount(kfs):
    """fusermount3 -u returns before the daemon notices: until it does, its lock file still says it is
    serving. Held still with SIGSTOP, the old daemon is in that window for as long as the test likes; the
    new one must see that the old one's mount is gone and wait, not call the index in use."""
    m = kfs({"max_size": "64M"})
    with open(m.path("f"), "wb") as f:
        f.write(os.urandom(300000))
    old = m.pid()
    os.kill(old, signal.SIGSTOP)
    try:
        subprocess.run(["fusermount3", "-u", m.mnt], check=True, timeout=30)
        new = subprocess.Popen(m.args(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        assert new.poll() is None, f"the new daemon did not wait: {new.communicate()[1]}"
    finally:
        os.kill(old, signal.SIGCONT)
    _, err = new.communicate(timeout=60)
    assert new.returncode == 0, err
    wait_for(lambda: os.path.ismount(m.mnt), what="mount")
    assert m.pid() != old
    assert os.listdir(m.mnt) == ["f"]

    # A daemon that still serves its mount is another matter: the second one is refused at once.
    other = os.path.join(os.path.dirname(m.mnt), "other-mnt")
    os.makedirs(other)
    t0 = time.monotonic()
    p = subprocess.run(m.args()[:-1] + [other], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "is in use by another kcachefs" in p.stderr, p.stderr
    assert time.monotonic() - t0 < 5


@pytest.mark.skipif(os.path.exists("/dev/log"), reason="a syslog daemon runs here: its log is not ours to read")
def test_a_detached_daemon_says_what_happens_in_syslog(kfs):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("/dev/log")  # syslog(3)'s socket, as a syslog daemon or journald would hold it
    sock.settimeout(10)
    try:
        m = kfs({"max_size": "4M"})
        pid = m.pid()
        got = []
        while not any("mounted" in g for g in got):
            got.append(sock.recv(4096).decode())
        assert any(f"kcachefs[{pid}]: mounted {m.backing} on {m.mnt}" in g for g in got), got
        m.stop()
        while not any("unmounted" in g for g in got):
            got.append(sock.recv(4096).decode())
        assert any("the index is flushed and marked clean" in g for g in got), got
        assert all(g.startswith("<") for g in got)  # priority, facility daemon
    finally:
        sock.close()
        os.unlink("/dev/log")
