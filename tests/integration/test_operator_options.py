"""What an operator types and what mount(8) sees: every numeric option range-checked in one line that names
the option, the value and the range (nothing made, nothing mounted); sizes and durations read as
common/parse.c reads them; every layout value documented; the mount's source is the backing directory and
its type fuse.kcachefs, so that df and findmnt tell two caches apart and `mount -a` twice mounts once;
every mount nosuid,nodev; and a detached daemon's messages reach a file where there is no syslog."""
import json
import os
import re
import subprocess
import time

import pytest

from conftest import ROOT, kcachefs_bin, private_dir, wait_for

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounts through mount(8) in a mount namespace")


def run(*args, env=None):
    return subprocess.run([kcachefs_bin(), *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture
def dirs(workdir):
    d, cleanup = workdir
    b, m = os.path.join(private_dir(d), "b"), os.path.join(d, "m")
    os.makedirs(b)
    os.makedirs(m)
    cleanup.insert(0, m)
    return d, b, m


def mountinfo(mnt):
    """(per-mount flags, type, source) of MNT in /proc/self/mountinfo, or None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            a = line.split()
            if a[4] == mnt:
                i = a.index("-")
                return set(a[5].split(",")), a[i + 1], a[i + 2]
    return None


@pytest.mark.parametrize("opt,allowed", [
    ("grace_ms=-5", "from 0 to 3600000"),  # was read as 2^32 - 5 ms, about 50 days
    ("grace_ms=3600001", "from 0 to 3600000"),
    ("flush_ms=-1", "from 10 to 60000"),
    ("flush_ms=0", "from 10 to 60000"),
    ("flush_ms=5s", "from 10 to 60000"),
    ("max_size=1", "from 64K to 1024P"),
    ("max_size=63K", "from 64K to 1024P"),
    ("max_size=2048P", "from 64K to 1024P"),
    ("inode_fds=0", "from 1 to"),
    ("inode_fds=-1", "from 1 to"),
    ("timeout=-1", "from 0 to 1d"),
    ("timeout=2d", "from 0 to 1d"),
    ("tmp_age=0", "from 1s to 30d"),
    ("tmp_age=nan", "from 1s to 30d"),
    ("low_watermark=-5", "from 1 to 100"),
    # the shared tier's numbers: fuse_opt's sscanf took "-1" and "nan" for "not given" and "5x" for 5
    ("remote_timeout_ms=-1", "from 1 to 60000"),
    ("remote_timeout_ms=5x", "from 1 to 60000"),
    ("remote_timeout_ms=0", "from 1 to 60000"),
    ("remote_negative_s=-1", "from 0 to 1d"),
    ("remote_negative_s=nan", "from 0 to 1d"),
    ("remote_touch_s=0", "from 0.1s to 1d"),
    ("remote_touch_s=5x", "from 0.1s to 1d"),
    ("herd_wait=nan", "from 0 to 1h"),
    ("herd_wait=2h", "from 0 to 1h"),
])
def test_a_number_out_of_range_is_refused_in_one_line_naming_it(dirs, opt, allowed):
    d, b, m = dirs
    p = run("-o", opt, b, m)
    assert p.returncode != 0, f"-o {opt} mounted"
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("kcachefs: "), p.stderr
    name, value = opt.split("=", 1)
    assert f"invalid {name} '{value}'" in lines[0] and allowed in lines[0], lines[0]
    assert not os.path.ismount(m)
    assert os.listdir(b) == [], f"-o {opt} left {os.listdir(b)}"


@pytest.mark.parametrize("opts,size", [("max_size=1.5G", 3 << 29), ("max_size=64K", 64 << 10),
                                       ("max_size=1M,timeout=1h,tmp_age=2.5m,grace_ms=0,flush_ms=10,inode_fds=1",
                                        1 << 20)])
def test_sizes_and_durations_read_as_kcache_reads_them(dirs, opts, size):
    d, b, m = dirs
    p = run("-o", opts, b, m)
    assert p.returncode == 0, p.stderr
    wait_for(lambda: os.path.ismount(m), what="mount")
    s = os.statvfs(m)
    assert s.f_blocks * s.f_frsize == size
    subprocess.run(["fusermount3", "-u", m], check=True)


@pytest.mark.parametrize("opts,key,value", [("remote_negative_s=2m", "remote_negative_s", 120),
                                             ("remote_touch_s=1.5", "remote_touch_s", 1.5),
                                             ("herd_wait=1m", "herd_wait", 60), ("remote_timeout_ms=250", "remote_timeout_ms", 250)])
def test_the_shared_tiers_numbers_read_as_the_others(dirs, opts, key, value):
    """Durations as common/parse.c reads them (2m is 120 s, not 2): kcache config shows what the mount took."""
    d, b, m = dirs
    p = run("-o", f"remote=redis://127.0.0.1:1,{opts}", b, m)  # no server: lookups miss, the mount serves
    assert p.returncode == 0, p.stderr
    try:
        wait_for(lambda: os.path.ismount(m), what="mount")
        kc = os.path.join(ROOT, os.environ.get("KCACHE_BUILD", "build"), "kcache")
        c = json.loads(subprocess.run([kc, "config", "--json", m], capture_output=True, text=True, check=True).stdout)
        assert c[key] == value, c
    finally:
        subprocess.run(["fusermount3", "-u", m])


def help_and_page_entries():
    """{option: text} of kcachefs --help's own options and of kcachefs(8)'s OPTIONS, roff taken out."""
    ours = run("--help").stdout.split("kcachefs options:")[1].split("FUSE options:")[0]
    helped = {m.group(1): " ".join(m.group(2).split())
              for m in re.finditer(r"^\s+-o ([a-z_]+)(.*?)(?=^\s+-o [a-z_]+|^\S|\Z)", ours, re.M | re.S)}
    page = open(os.path.join(ROOT, "man", "kcachefs.8")).read().split(".SH OPTIONS")[1].split(".SH ")[0]
    entries = {}
    for e in page.split(".TP\n")[1:]:
        head, _, body = e.partition("\n")
        text = re.sub(r"\\f[BIRP]|\\\(..", "", body).replace("\\-", "-").replace("\\", "")
        entries[re.match(r"\.(?:BI|BR|B) ([a-z_]+)", head).group(1)] = " ".join(text.split())
    return helped, entries


def test_every_options_range_and_default_in_help_are_the_pages():
    helped, entries = help_and_page_entries()
    assert len(helped) > 25 and set(helped) <= set(entries), set(helped) - set(entries)
    ranged = 0
    for name, text in helped.items():
        for lo, hi in re.findall(r"(-?[\d.]+[A-Za-z]*) to ([\d.]+[A-Za-z]*)", text):
            assert re.search(rf"(?<![\w.]){re.escape(lo)} to {re.escape(hi)}\b", entries[name]), \
                f"{name}: --help says {lo} to {hi}, kcachefs(8) says: {entries[name]}"
            ranged += 1
        d = re.search(r"default(?:, and at most,)? ([^;,:)]+?)(?=[;,:)]|\. | \(|$)", text)
        if d:
            assert d.group(1).lower() in entries[name].lower(), \
                f"{name}: --help's default {d.group(1)!r}, kcachefs(8) says: {entries[name]}"
    assert ranged >= 10, ranged


def test_every_layout_value_is_documented():
    sys_names = re.findall(r'\.name = "([^"]+)"', open(os.path.join(ROOT, "common", "runtimes.c")).read())
    assert "mesa" in sys_names and "auto" in sys_names
    help_text = run("--help").stdout
    man = open(os.path.join(ROOT, "man", "kcachefs.8")).read().replace("\\-", "-")
    for name in sys_names:
        assert re.search(rf"^\s+{re.escape(name)}\s", help_text, re.M), f"layout {name} missing from --help"
        assert f"\\fB{name}\\fR" in man, f"layout {name} missing from kcachefs.8"


def in_namespace(d, mnt, script, timeout=120):
    """Runs SCRIPT (bash) in a mount namespace of its own where /usr/local/sbin holds only the kcachefs
    under test: mount(8) runs mount.fuse3 with a fixed PATH, which finds it there, and an installed
    kcachefs is left alone. MNT is unmounted when the script ends, however it ends, so no daemon outlives
    the namespace."""
    sbin = os.path.join(d, "sbin")
    os.makedirs(sbin, exist_ok=True)
    os.symlink(os.path.abspath(kcachefs_bin()), os.path.join(sbin, "kcachefs"))
    wrapped = (f"mount --bind {sbin} /usr/local/sbin || exit 99\n"
               f"trap 'mountpoint -q {mnt} && umount -l {mnt}' EXIT\n" + script)
    return subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", wrapped],
                          capture_output=True, text=True, timeout=timeout)


def fstab_line():
    line = next(l for l in open(os.path.join(ROOT, "contrib", "fstab.example")) if l.strip() and not l.startswith("#"))
    backing, mnt, fstype, opts, _, _ = line.split()
    return fstype, opts


def fstab_escape(path):
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")


@needs_root
@pytest.mark.parametrize("backing_name", ["backing", "a backing, with commas"])
def test_mount_a_twice_with_the_documented_fstab_line_mounts_once(workdir, backing_name):
    d, cleanup = workdir
    fstype, opts = fstab_line()
    backing, mnt = os.path.join(private_dir(d), backing_name), os.path.join(d, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    fstab = os.path.join(d, "fstab")
    with open(fstab, "w") as f:
        f.write(f"{fstab_escape(backing)} {mnt} {fstype} {opts} 0 0\n")
    p = in_namespace(d, mnt, f"""
        mount -a -T {fstab}; echo "first=$?"
        mount -a -T {fstab}; echo "second=$?"
        grep -c ' {mnt} ' /proc/self/mountinfo | sed 's/^/mounts=/'
        findmnt -n -o SOURCE {mnt} | sed 's/^/findmnt=/'
        findmnt -n -o FSTYPE {mnt} | sed 's/^/fstype=/'
        df --output=source {mnt} | tail -1 | sed 's/^/df=/'
        grep ' {mnt} ' /proc/self/mountinfo | sed 's/^/info=/'
        umount {mnt}""")
    out = dict(l.split("=", 1) for l in p.stdout.splitlines() if "=" in l)
    assert p.returncode == 0 and out.get("first") == "0" and out.get("second") == "0", p.stdout + p.stderr
    assert out["mounts"] == "1", p.stdout
    assert (out["findmnt"], out["fstype"]) == (backing, "fuse.kcachefs"), p.stdout
    assert out["df"].strip() == backing, out["df"]
    info = out["info"].split()
    assert {"nosuid", "nodev"} <= set(info[5].split(",")), info
    i = info.index("-")
    assert info[i + 1] == "fuse.kcachefs" and info[i + 2] == fstab_escape(backing), info


@needs_root
def test_an_fstab_mount_with_defaults_is_nosuid_nodev(workdir):
    """A private mount through fstab: mount(8) passes "suid,dev" for "defaults"; a cache holds no setuid
    program or device node, so every mount is nosuid,nodev."""
    d, cleanup = workdir
    backing, mnt = os.path.join(private_dir(d), "b"), os.path.join(d, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    fstab = os.path.join(d, "fstab")
    with open(fstab, "w") as f:
        f.write(f"{backing} {mnt} fuse.kcachefs defaults,max_size=4M 0 0\n")
    p = in_namespace(d, mnt, f"mount -T {fstab} {mnt}; grep ' {mnt} ' /proc/self/mountinfo | sed 's/^/info=/'; umount {mnt}")
    assert p.returncode == 0, p.stdout + p.stderr
    info = next(l for l in p.stdout.splitlines() if l.startswith("info=")).split()
    assert {"nosuid", "nodev"} <= set(info[5].split(",")), info


def test_two_caches_show_their_own_sources(workdir):
    d, cleanup = workdir
    mounts = []
    for name in ("one", "two"):
        b, m = os.path.join(private_dir(d), name), os.path.join(d, f"m-{name}")
        os.makedirs(b)
        os.makedirs(m)
        cleanup.insert(0, m)
        p = run("-o", "max_size=4M", b, m)
        assert p.returncode == 0, p.stderr
        mounts.append((b, m))
    for b, m in mounts:
        wait_for(lambda: os.path.ismount(m), what="mount")
        flags, fstype, source = mountinfo(m)
        assert (fstype, source) == ("fuse.kcachefs", b)
        assert {"nosuid", "nodev"} <= flags, flags
    for b, m in mounts:
        subprocess.run(["fusermount3", "-u", m], check=True)


LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z kcachefs\[(\d+)\] (err|warning|notice|info): (.*)$")


def log_lines(path, until, timeout=10):
    """The lines of the log file PATH, parsed, once one of them holds UNTIL."""
    def read():
        if not os.path.exists(path):
            return None
        lines = open(path).read().splitlines()
        return lines if any(until in l for l in lines) else None
    lines = wait_for(read, timeout=timeout, what=f"'{until}' in {path}")
    parsed = [LINE.match(l) for l in lines]
    assert all(parsed), lines
    return [(int(p.group(1)), p.group(2), p.group(3)) for p in parsed]


def test_a_detached_daemon_without_syslog_logs_into_the_backing_directory(dirs):
    """No syslog socket (as in containers and minimal images: KCACHEFS_SYSLOG_SOCKET points where none is),
    no journal (KCACHEFS_JOURNAL_SOCKET) and no log=: the messages go to BACKING/.kcachefs/kcachefs.log,
    and the first one says so."""
    d, b, m = dirs
    env = dict(os.environ, KCACHEFS_SYSLOG_SOCKET=os.path.join(d, "no-such-socket"),
               KCACHEFS_JOURNAL_SOCKET=os.path.join(d, "no-such-journal"))  # nor a journal
    p = run("-o", "max_size=4M", b, m, env=env)
    assert p.returncode == 0, p.stderr
    wait_for(lambda: os.path.ismount(m), what="mount")
    log = os.path.join(b, ".kcachefs", "kcachefs.log")
    lines = log_lines(log, "mounted")
    pid = lines[0][0]
    assert lines[0][1:] == ("notice", f"messages go to {log} (no syslog at {env['KCACHEFS_SYSLOG_SOCKET']}; "
                                      "-o log=FILE chooses another file)"), lines
    assert (pid, "info", f"mounted {b} on {m} (max_size 4194304 bytes, 0 files, 0 bytes used)") in lines, lines
    assert os.stat(log).st_mode & 0o777 == 0o600
    assert ".kcachefs" not in os.listdir(m)  # the mount never shows it
    subprocess.run(["fusermount3", "-u", m], check=True)
    lines = log_lines(log, "unmounted")
    assert (pid, "info", f"unmounted {m}; the index is flushed and marked clean") in lines, lines


def test_with_the_index_elsewhere_the_log_goes_beside_it(dirs):
    """A backing directory whose index is elsewhere gets no .kcachefs of ours: the log goes beside the index."""
    d, b, m = dirs
    index = os.path.join(private_dir(d), "idx.db")
    env = dict(os.environ, KCACHEFS_SYSLOG_SOCKET=os.path.join(d, "no-such-socket"),
               KCACHEFS_JOURNAL_SOCKET=os.path.join(d, "no-such-journal"))  # nor a journal
    p = run("-o", f"max_size=4M,index={index}", b, m, env=env)
    assert p.returncode == 0, p.stderr
    wait_for(lambda: os.path.ismount(m), what="mount")
    lines = log_lines(index + ".log", "mounted")
    assert lines[0][1:] == ("notice", f"messages go to {index}.log (no syslog at {env['KCACHEFS_SYSLOG_SOCKET']}; "
                                      "-o log=FILE chooses another file)"), lines
    assert os.listdir(b) == []
    subprocess.run(["fusermount3", "-u", m], check=True)


def test_log_appends_to_the_file_given(dirs):
    d, b, m = dirs
    log = os.path.join(d, "kcachefs.log")
    with open(log, "w") as f:
        f.write("2026-01-01T00:00:00.000Z kcachefs[1] info: an earlier line\n")
    p = run("-o", f"max_size=4M,log={log}", b, m)
    assert p.returncode == 0, p.stderr
    wait_for(lambda: os.path.ismount(m), what="mount")
    lines = log_lines(log, "mounted")
    assert lines[0] == (1, "info", "an earlier line")
    assert lines[1][1:] == ("notice", f"messages go to {log}"), lines
    assert not os.path.exists(os.path.join(b, ".kcachefs", "kcachefs.log"))
    subprocess.run(["fusermount3", "-u", m], check=True)
    log_lines(log, "unmounted")


@needs_root
def test_a_warning_of_the_running_daemon_reaches_its_log_once_with_its_priority(dirs):
    """A pin on a backing filesystem without user extended attributes (ramfs) is kept in the index only,
    and the detached daemon says so: through kfs_log at warning, not through stderr's pipe, which took it
    for an unknown line and logged 'warning: warning: ...'."""
    d, b, m = dirs
    subprocess.run(["mount", "-t", "ramfs", "-o", "mode=0755", "ramfs", b], check=True)
    dirs_cleanup = b
    log = os.path.join(d, "daemon.log")
    try:
        p = run("-o", f"log={log}", b, m)
        assert p.returncode == 0, p.stderr
        wait_for(lambda: os.path.ismount(m), what="mount")
        for n in ("one", "two"):
            with open(os.path.join(m, n), "w") as f:
                f.write(n)
            kc = os.path.join(ROOT, os.environ.get("KCACHE_BUILD", "build"), "kcache")
            subprocess.run([kc, "pin", os.path.join(m, n)], check=True, capture_output=True, timeout=60)
        lines = log_lines(log, "no user extended attributes")
        said = [(prio, msg) for _, prio, msg in lines if "no user extended attributes" in msg]
        assert said == [("warning", f"{b} has no user extended attributes: pins are kept in the index only, and "
                                    "a rebuild of a lost or corrupt index forgets them")], lines
    finally:
        subprocess.run(["fusermount3", "-u", m], capture_output=True)
        wait_for(lambda: not os.path.ismount(m), what="unmount")
        subprocess.run(["umount", "-l", dirs_cleanup], capture_output=True)


@pytest.mark.parametrize("where", ["backing", "mount", "missing"])
def test_a_log_where_it_cannot_be_is_refused_in_one_line(dirs, where):
    d, b, m = dirs
    log = {"backing": os.path.join(b, "k.log"), "mount": os.path.join(m, "k.log"),
           "missing": os.path.join(d, "nowhere", "k.log")}[where]
    p = run("-o", f"max_size=4M,log={log}", b, m)
    assert p.returncode != 0
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("kcachefs: ") and "log" in lines[0], p.stderr
    assert not os.path.ismount(m) and os.listdir(b) == [] and not os.path.exists(log)


@pytest.mark.skipif(os.path.exists("/dev/log"), reason="a syslog daemon runs here: its socket is not ours to hold")
def test_syslog_gets_the_priority_each_message_names(kfs):
    """Each message's priority is the one its call site names (daemon.info for mount and unmount, daemon.notice
    for where messages go), not one guessed from its words."""
    import socket
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("/dev/log")
    sock.settimeout(10)
    try:
        m = kfs({"max_size": "4M"})
        pid = m.pid()
        got = []  # ours only: another daemon on this machine may send to /dev/log meanwhile

        def receive(until):
            while not any(f"kcachefs[{pid}]: {until}" in g for g in got):
                g = sock.recv(4096).decode()
                if f"kcachefs[{pid}]: " in g:
                    got.append(g)
        receive("mounted")
        m.stop()
        receive("unmounted")
        prio = {g.split(f"kcachefs[{pid}]: ", 1)[1].split(" ")[0]: int(g[1:g.index(">")]) for g in got}
        daemon = 3 << 3
        assert prio["mounted"] == daemon + 6 and prio["unmounted"] == daemon + 6, got  # info
        assert prio["messages"] == daemon + 5, got  # notice
    finally:
        sock.close()
        os.unlink("/dev/log")


def journal_stream_run(args, until):
    """Runs kcachefs ARGS with its stderr a pipe that $JOURNAL_STREAM names, as systemd's journal stream
    would be; returns the lines it wrote until one holds UNTIL (or it exited), and the process."""
    r, w = os.pipe()
    st = os.fstat(w)
    env = dict(os.environ, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
    p = subprocess.Popen([kcachefs_bin(), *args], stderr=w, stdout=subprocess.DEVNULL, env=env)
    os.close(w)
    lines, buf = [], b""
    f = os.fdopen(r, "rb", buffering=0)
    import select
    deadline = time.monotonic() + 30
    while not any(until in l for l in lines) and time.monotonic() < deadline:
        if select.select([f], [], [], 0.1)[0]:
            chunk = f.read(4096)
            if not chunk:
                break
            buf += chunk
            *done, buf = buf.split(b"\n")
            lines += [l.decode() for l in done]
    return lines, p, f


def test_in_the_journal_each_line_carries_its_priority(dirs):
    """Under systemd (-f, stderr the journal's stream) each line starts with its priority, "<N>", which the
    journal reads (sd-daemon(3)): a refusal is an error, the mount is info."""
    d, b, m = dirs
    lines, p, f = journal_stream_run(["-f", "-o", "max_size=1", b, m], "max_size")
    try:
        wait_for(lambda: p.poll() is not None, what="the refusal")
    finally:
        if p.poll() is None:  # it mounted: gone with the fixture's unmount
            subprocess.run(["fusermount3", "-u", "-z", m], capture_output=True)
            p.wait(timeout=30)
        f.close()
    assert p.returncode != 0 and lines and lines[0].startswith("<3>kcachefs: invalid max_size '1'"), lines
    lines, p, f = journal_stream_run(["-f", "-o", "max_size=4M", b, m], "mounted")
    try:
        assert f"<6>kcachefs: mounted {b} on {m} (max_size 4194304 bytes, 0 files, 0 bytes used)" in lines, lines
    finally:
        wait_for(lambda: os.path.ismount(m) or p.poll() is not None, what="mount")
        subprocess.run(["fusermount3", "-u", m], capture_output=True)
        p.wait(timeout=30)
        f.close()
