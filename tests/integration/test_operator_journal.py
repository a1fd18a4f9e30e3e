"""Messages that reach someone: where the journal answers, a detached daemon sends its messages there itself
(sd_journal_send), each with its priority and the mount it speaks of (MOUNT=), and the first one says
so. The journal here is a socket of the test's, bound where libsystemd sends (/run/systemd/journal/socket)
inside a mount namespace of the daemon's own, so that nothing on the machine is touched."""
import os
import shutil
import socket
import struct
import subprocess
import time

import pytest

from conftest import kcachefs_bin, private_dir

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="binds the journal's socket in a mount namespace (root, unshare)")


def journal_fields(data):
    """The fields of one datagram of the journal's native protocol (systemd's JOURNAL_NATIVE_PROTOCOL):
    FIELD=value lines, or FIELD, a newline, a 64-bit little-endian length and the value, for a value
    holding a newline."""
    fields, i = {}, 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            k, v = line.split(b"=", 1)
            i = nl + 1
        else:
            k, (n,) = line, struct.unpack_from("<Q", data, nl + 1)
            v = data[nl + 9:nl + 9 + n]
            i = nl + 9 + n + 1
        fields[k.decode()] = v.decode(errors="surrogateescape")
    return fields


def journal_place(d, mount_name):
    """A backing directory, a mount point named mount_name and a directory whose socket plays the journal's
    (bound here, read with a 30 s deadline), for a mount namespace to bind over /run/systemd/journal."""
    b, m, jdir = os.path.join(private_dir(d), "b"), os.path.join(d, mount_name), os.path.join(d, "journal")
    for p in (b, m, jdir):
        os.makedirs(p)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(os.path.join(jdir, "socket"))
    sock.settimeout(30)
    return b, m, jdir, sock


@needs_root
def test_a_detached_daemon_logs_to_the_journal_with_priority_and_mount(workdir):
    d, cleanup = workdir
    b, m, jdir, sock = journal_place(d, 'm "q')
    # /run is a tmpfs of the namespace's own; the daemon lives there and is unmounted there.
    script = ('mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal && '
              'mount --bind "$1" /run/systemd/journal && "$2" -o max_size=4M "$3" "$4" && umount "$4"')
    got = []
    try:
        p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", script, "sh", jdir,
                            kcachefs_bin(), b, m], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        deadline = time.monotonic() + 30
        while not any(g.get("MESSAGE", "").startswith("unmounted") for g in got):
            assert time.monotonic() < deadline, got
            got.append(journal_fields(sock.recv(65536)))
    finally:
        sock.close()
    ours = [g for g in got if g.get("SYSLOG_IDENTIFIER") == "kcachefs"]
    assert ours and ours[0]["MESSAGE"] == "messages go to the journal" and ours[0]["PRIORITY"] == "5", got
    mounted = [g for g in ours if g["MESSAGE"].startswith("mounted ")]
    assert mounted and mounted[0]["PRIORITY"] == "6", got  # info
    assert all(g["MOUNT"] == m and g["SYSLOG_FACILITY"] == "3" for g in ours), got  # daemon
    assert not os.path.exists(os.path.join(b, ".kcachefs", "kcachefs.log"))  # not the fallback file


@needs_root
def test_under_systemd_in_the_foreground_messages_go_to_the_journal_and_ready_is_told(workdir):
    """As the unit runs it (Type=notify, -f, stderr the journal's stream): the messages go to the journal with
    their fields rather than down the stream, and systemd hears READY=1 once it serves, STOPPING=1 at the
    unmount (sd_notify)."""
    d, cleanup = workdir
    b, m, jdir, sock = journal_place(d, "m")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(os.path.join(d, "notify"))
    notify.settimeout(30)
    r, w = os.pipe()
    st = os.fstat(w)
    env = dict(os.environ, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}", NOTIFY_SOCKET=os.path.join(d, "notify"))
    script = ('mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal && '
              'mount --bind "$1" /run/systemd/journal && { "$2" -f -o max_size=4M "$3" "$4" & } && '
              'for i in $(seq 3000); do mountpoint -q "$4" && break; sleep 0.01; done && umount "$4" && wait')
    got, told = [], []
    try:
        p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", script, "sh", jdir,
                            kcachefs_bin(), b, m], stdout=subprocess.DEVNULL, stderr=w, env=env, timeout=60)
        os.close(w)
        w = None
        assert p.returncode == 0
        told = [notify.recv(256), notify.recv(256)]
        deadline = time.monotonic() + 30
        while not any(g.get("MESSAGE", "").startswith("unmounted") for g in got):
            assert time.monotonic() < deadline, got
            got.append(journal_fields(sock.recv(65536)))
        stream = os.read(r, 65536).decode()
    finally:
        if w is not None:
            os.close(w)
        os.close(r)
        sock.close()
        notify.close()
    assert told == [b"READY=1", b"STOPPING=1"]
    ours = [g for g in got if g.get("SYSLOG_IDENTIFIER") == "kcachefs"]
    assert ours[0]["MESSAGE"] == "messages go to the journal" and all(g["MOUNT"] == m for g in ours), got
    assert [g["PRIORITY"] for g in ours if g["MESSAGE"].startswith("mounted ")] == ["6"], got
    assert "mounted" not in stream, stream  # said once, in the journal
