"""Live settings (fs/settings.c, cli/config.c): kcache config shows every setting of a running mount,
kcache set changes the ones that can change (only for the owner or root; a bad value changes nothing), a
smaller max_size is reached under load and then held, the settings file (-o config=FILE) is read at mount
and again at SIGHUP, which no longer unmounts, and a rerun of ./quickstart with a new size changes the
running mount's limit."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import ROOT, WriteGate, backing_bytes, ensure_user, kcachefs_bin, private_dir, wait_for
from test_cli_kcache import kcache as cli_kcache

K, M = 1024, 1024 * 1024


def kcache(*args, **kw):
    """test_cli_kcache's, with room for kcache set --wait under ASan."""
    return cli_kcache(*args, timeout=120, **kw)


def config(m):
    return json.loads(kcache("config", "--json", m.mnt).stdout)


def fill(m, prefix, n, size):
    for i in range(n):
        with open(m.path(f"{prefix}{i}"), "wb") as f:
            f.write(os.urandom(size))


def test_config_shows_the_mounts_settings_plain_and_json(kfs, workdir):
    auth = os.path.join(private_dir(workdir[0]), "redis.auth")
    with open(auth, "w") as f:
        f.write("s3cret-password\n")
    os.chmod(auth, 0o600)
    m = kfs({"max_size": "3M", "low_watermark": "80", "grace_ms": "700", "tmp_age": "2h", "protect": "writers",
             "stale_locks": True, "pin": "keep*:x/y", "flush_ms": "250", "timeout": "10",
             "remote": "redis://127.0.0.1:1", "remote_auth": auth})
    c = config(m)
    assert c["mount"] == m.mnt
    assert c["max_size"] == 3 * M and c["low_watermark"] == 80 and c["grace_ms"] == 700
    assert c["tmp_age"] == 7200 and c["protect"] == "writers" and c["stale_locks"] == 1
    assert c["pin"] == "keep*:x/y" and c["flush_ms"] == 250 and c["timeout"] == 10
    assert c["backing"] == os.path.realpath(m.backing) and c["mountpoint"] == os.path.realpath(m.mnt)
    assert c["index"] == os.path.join(os.path.realpath(m.backing), ".kcachefs", "index.db")
    assert c["remote"] == "redis://127.0.0.1:1" and c["remote_auth"] == auth
    assert c["config"] is None and c["log"]  # no settings file; messages go somewhere, said
    for k in ("layout", "inode_fds", "remote_timeout_ms", "herd_wait", "owner"):
        assert k in c, k
    plain = kcache("config", m.mnt).stdout
    assert "s3cret" not in plain and "s3cret" not in json.dumps(c)  # the auth file's name, never its content
    rows = dict(line.split(None, 1) for line in plain.splitlines())
    assert rows["max_size"] == "3.0 MiB (3145728 bytes)" and rows["protect"] == "writers", plain
    assert rows["backing"] == os.path.realpath(m.backing) and rows["remote_auth"] == auth, plain


def test_set_by_another_user_is_refused(kfs):
    m = kfs({"max_size": "8M", "allow_other": True, "default_permissions": True})
    ensure_user("kcfs-user2")
    assert kcache("config", m.mnt, user="kcfs-user2").returncode == 0  # reading is for everyone
    p = kcache("set", m.mnt, "max_size=4M", check=False, user="kcfs-user2")
    assert p.returncode == 1 and "owner" in p.stderr, p.stderr
    assert config(m)["max_size"] == 8 * M
    assert int(os.getxattr(m.mnt, "user.kcachefs.max_bytes")) == 8 * M


@pytest.mark.parametrize("args,words", [
    (["max_size=10"], "invalid max_size '10'"),                       # below 64K: the mount's own check
    (["max_size=2M", "grace_ms=-5"], "invalid grace_ms '-5'"),        # all or nothing: max_size stays
    (["low_watermark=101"], "invalid low_watermark '101'"),
    (["protect=nobody"], "invalid protect 'nobody'"),
    (["tmp_age=0"], "invalid tmp_age '0'"),
    (["backing=/elsewhere"], "backing cannot change on a running mount"),
    (["flush_ms=100"], "flush_ms cannot change on a running mount"),
    (["nonsense=1"], "unknown setting 'nonsense'"),
])
def test_set_with_a_bad_value_is_refused_and_nothing_changes(kfs, args, words):
    m = kfs({"max_size": "8M", "grace_ms": "700"})
    before = config(m)
    p = kcache("set", m.mnt, *args, check=False)
    assert p.returncode == 1 and words in p.stderr and "nothing changed" in p.stderr, p.stderr
    assert p.stdout == ""
    assert config(m) == before


def test_set_without_a_value_is_bad_usage(kfs):
    m = kfs({"max_size": "8M"})
    for args in (["max_size"], [], ["=5"]):
        p = kcache("set", m.mnt, *args, check=False)
        assert p.returncode == 2 and p.stdout == "", (args, p.stderr)
    assert config(m)["max_size"] == 8 * M


def test_set_changes_the_live_settings_at_once(kfs):
    m = kfs({"max_size": "8M"})
    p = kcache("set", m.mnt, "max_size=12M", "low_watermark=70", "grace_ms=250", "tmp_age=10m",
               "protect=writers", "pin=a*:b", "stale_locks=1")
    assert "max_size 12582912 (was 8388608)" in p.stdout, p.stdout
    c = config(m)
    assert (c["max_size"], c["low_watermark"], c["grace_ms"], c["tmp_age"], c["protect"], c["pin"],
            c["stale_locks"]) == (12 * M, 70, 250, 600, "writers", "a*:b", 1)
    assert int(os.getxattr(m.mnt, "user.kcachefs.max_bytes")) == 12 * M
    assert os.statvfs(m.mnt).f_blocks * os.statvfs(m.mnt).f_frsize == 12 * M  # df's size follows


def test_a_pin_set_live_keeps_its_files_from_eviction(kfs):
    m = kfs({"max_size": "8M", "grace_ms": "0"})
    fill(m, "keep-", 2, 64 * K)
    fill(m, "other-", 2, 64 * K)
    kcache("set", m.mnt, "pin=keep-*")
    kcache("evict", m.mnt, "--to", "0")
    assert sorted(n for n in os.listdir(m.mnt) if n != "users") == ["keep-0", "keep-1"]
    kcache("set", m.mnt, "pin=")  # no pins at all: they go too
    kcache("evict", m.mnt, "--to", "0")
    assert [n for n in os.listdir(m.mnt) if n != "users"] == []


def test_shrinking_a_live_mount_under_load_reaches_and_holds_the_new_limit(kfs):
    m = kfs({"max_size": "24M", "grace_ms": "200"}, tmpfs_size="64m")
    fill(m, "old", 80, 256 * K)  # 20 MiB, older than the grace when the limit drops
    assert m.used() > 16 * M
    time.sleep(0.3)  # past grace_ms, so that the old files may go (the writers' new ones may not)
    stop = threading.Event()
    errors = []
    gate = WriteGate()
    written = [0, 0]

    def writer(w):
        try:
            while not stop.is_set():
                with gate.writing(), open(m.path(f"new-{w}-{written[w] % 64}"), "wb") as f:
                    f.write(os.urandom(64 * K))
                written[w] += 1
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    try:
        p = kcache("set", m.mnt, "max_size=6M", "--wait", "60s")
        assert "max_size 6291456 (was 25165824)" in p.stdout, p.stdout
        assert "within the new limit" in p.stderr, p.stderr
        # Held while the writers go on: the daemon's own count at any moment, and the backing filesystem's
        # files between two writes (the cache is full to the byte, so a walk racing the writers would count
        # a file and its replacement both: WriteGate).
        deadline = time.monotonic() + 2.0
        samples, before = 0, sum(written)
        while time.monotonic() < deadline:
            assert m.used() <= 6 * M
            with gate.quiet():
                m.assert_within(6 * M)
            samples += 1
            time.sleep(0.005)  # the writers' turn
        assert samples > 5 and sum(written) - before > samples, (samples, sum(written) - before)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    m.assert_within(6 * M)
    du = subprocess.run(["du", "-s", "-B1", "--exclude=.kcachefs", m.backing], capture_output=True, text=True,
                        check=True).stdout.split()[0]
    assert int(du) <= 6 * M + 64 * K, du  # du counts the directories' own blocks too (none on tmpfs)
    assert os.path.ismount(m.mnt)


@pytest.mark.parametrize("low", ["90", "100"])
def test_shrinking_an_idle_mount_evicts_in_the_background(kfs, low):
    """No write comes to evict in line: the new limit wakes the daemon's background eviction (with
    low_watermark=100 too, where no high mark would start it)."""
    m = kfs({"max_size": "16M", "grace_ms": "100", "low_watermark": low})
    fill(m, "old", 48, 256 * K)  # 12 MiB
    time.sleep(0.2)  # past grace_ms
    p = kcache("set", m.mnt, "max_size=4M", "--wait", "10s")
    assert "within the new limit" in p.stderr, p.stderr
    m.assert_within(4 * M)
    assert int(os.getxattr(m.mnt, "user.kcachefs.evicted_bytes")) >= 8 * M


def settings_file(d, text):
    path = os.path.join(d, "kcachefs.conf")
    with open(path, "w") as f:
        f.write(text)
    return path


def log_of(d):
    return os.path.join(d, "kcachefs-messages.log")


def test_the_settings_file_at_mount_and_the_command_line_wins(kfs, workdir):
    d = workdir[0]
    conf = settings_file(d, "# a comment\nmax_size = 8M\ngrace_ms = 900\nprotect = writers\nstale_locks = yes\n"
                            "remote_touch_s = 7\nremote_negative_s = 9\n")
    m = kfs({"config": conf, "grace_ms": "300", "remote_negative_s": "3"})
    c = config(m)
    assert c["config"] == conf and c["max_size"] == 8 * M and c["protect"] == "writers" and c["stale_locks"] == 1
    assert c["remote_touch_s"] == 7
    assert c["grace_ms"] == 300 and c["remote_negative_s"] == 3  # the command line's
    bad = settings_file(d, "max_size = 8M\nmax_sise = 9M\n")
    m2 = kfs({"config": bad}, start=False)
    p = m2.start(check=False)
    assert p.returncode != 0 and "kcachefs.conf:2: unknown setting 'max_sise'" in p.stderr, p.stderr
    assert not os.path.ismount(m2.mnt)


def test_sighup_rereads_the_settings_file_and_the_mount_stays(kfs, workdir):
    d = workdir[0]
    conf = settings_file(d, "max_size = 8M\ngrace_ms = 500\n")
    m = kfs({"config": conf, "log": log_of(d), "low_watermark": "80"})
    fill(m, "f", 4, 64 * K)
    pid = m.pid()
    settings_file(d, "max_size = 16M\ngrace_ms = 900\nlow_watermark = 50\nlayout = neo\n")
    os.kill(pid, signal.SIGHUP)
    wait_for(lambda: config(m)["max_size"] == 16 * M, what="the new max_size")
    c = config(m)
    assert c["grace_ms"] == 900 and c["low_watermark"] == 80  # the command line's low_watermark stays
    assert c["layout"] == ""  # cannot change live: said, and kept
    assert os.path.ismount(m.mnt) and m.pid() == pid
    assert open(m.path("f1"), "rb").read(1)
    log = wait_for(lambda: (lambda t: "re-read" in t and t)(open(log_of(d)).read()), what="the log")
    assert "max_size 8388608 -> 16777216 bytes (SIGHUP" in log, log
    assert "layout in" in log and "cannot change on a running mount" in log, log
    assert "low_watermark in" in log and "wins" in log, log


@pytest.mark.parametrize("text,words", [
    ("max_size = 16M\nbogus = 1\n", "unknown setting 'bogus'"),
    ("max_size = 16M\ngrace_ms = forever\n", "invalid grace_ms 'forever'"),
    ("max_size = 16M\n[section]\ngrace_ms = 1\n", "sections are not used"),
])
def test_sighup_with_a_bad_file_keeps_the_settings_and_the_mount(kfs, workdir, text, words):
    d = workdir[0]
    conf = settings_file(d, "max_size = 8M\ngrace_ms = 500\n")
    m = kfs({"config": conf, "log": log_of(d)})
    before, pid = config(m), m.pid()
    settings_file(d, text)
    os.kill(pid, signal.SIGHUP)
    log = wait_for(lambda: (lambda t: "refused" in t and t)(open(log_of(d)).read()), what="the refusal")
    assert words in log and "kept as they were" in log, log
    assert config(m) == before
    assert os.path.ismount(m.mnt) and m.pid() == pid


@pytest.mark.timeout(900)
def test_quickstart_rerun_with_a_new_size_changes_the_running_limit():
    if "asan" in kcachefs_bin():
        pytest.skip("the quick start builds its own release build: once, in the plain pass")
    tmp = tempfile.mkdtemp(prefix="kcachefs-qs-live-")
    prefix, backing, mnt = (os.path.join(tmp, n) for n in ("prefix", "private/backing", "mnt"))
    env = dict(os.environ, PREFIX=prefix, KCACHEFS_BUILDDIR=os.path.join(tmp, "build"),
               KCACHEFS_OPTIONS="max_size=8M")
    qs = [os.path.join(ROOT, "quickstart"), backing, mnt]
    try:
        first = subprocess.run(qs, env=env, capture_output=True, text=True, timeout=800)
        assert first.returncode == 0, first.stdout + first.stderr
        assert int(os.getxattr(mnt, "user.kcachefs.max_bytes")) == 8 * M
        pid = open(os.path.join(backing, ".kcachefs", "index.db.lock")).read().split()[0]
        for i in range(6):  # 6 MiB, above the smaller limit below
            with open(os.path.join(mnt, f"f{i}"), "wb") as f:
                f.write(os.urandom(M))
        for size, words in ((16 * M, "max_size 16777216 (was 8388608)"), (4 * M, "max_size 4194304 (was 16777216)")):
            env["KCACHEFS_OPTIONS"] = f"max_size={size // M}M,grace_ms=0"
            again = subprocess.run(qs, env=env, capture_output=True, text=True, timeout=800)
            assert again.returncode == 0, again.stdout + again.stderr
            assert "already mounted" in again.stdout and words in again.stdout, again.stdout
            assert int(os.getxattr(mnt, "user.kcachefs.max_bytes")) == size
            assert open(os.path.join(backing, ".kcachefs", "index.db.lock")).read().split()[0] == pid
        assert int(os.getxattr(mnt, "user.kcachefs.used_bytes")) <= 4 * M
        assert backing_bytes(backing) <= 4 * M
        # the settings file the quick start keeps (the unit's and fstab's format) holds the new size: the
        # next mount, with no KCACHEFS_OPTIONS at all, comes back with it, from that file
        conf = os.path.join(tmp, "private", "backing.conf")
        text = open(conf).read()
        assert "max_size = 4M" in text and "grace_ms = 0" in text and f"backing = {backing}" in text, text
        assert os.stat(conf).st_mode & 0o077 == 0
        subprocess.run(["fusermount3", "-u", mnt], check=True, timeout=60)
        del env["KCACHEFS_OPTIONS"]
        third = subprocess.run(qs, env=env, capture_output=True, text=True, timeout=800)
        assert third.returncode == 0, third.stdout + third.stderr
        assert int(os.getxattr(mnt, "user.kcachefs.max_bytes")) == 4 * M
        assert f"Its settings: {conf}" in third.stdout, third.stdout
        assert json.loads(kcache("config", "--json", mnt).stdout)["config"] == conf
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", mnt])
        shutil.rmtree(tmp, ignore_errors=True)


def test_shrinking_says_its_progress_until_within_the_new_limit(kfs):
    """The files are all used within grace_ms when the limit drops, so eviction must wait for them: kcache
    set says where used_bytes stands as it goes down ("evicting down to"), then that it is within the
    limit, and the background eviction gets there once the grace has passed, with no write to start it."""
    m = kfs({"max_size": "16M", "grace_ms": "3000"})  # longer than the fill takes, under ASan too
    fill(m, "young", 40, 256 * K)  # 10 MiB, every file used just now
    p = kcache("set", m.mnt, "max_size=4M", "--wait", "30s")
    progress = [l for l in p.stderr.splitlines() if l.startswith("kcache: evicting down to 4.0 MiB: ")]
    assert progress, p.stderr
    assert p.stderr.splitlines()[-1].endswith("within the new limit of 4.0 MiB"), p.stderr
    m.assert_within(4 * M)


def test_every_option_of_kcachefs_help_is_a_setting_of_the_file_and_of_config(kfs, workdir):
    """kcachefs(8): the settings file takes every -o option by its name, and kcache config shows every
    setting of the running mount. A settings file that gives each of kcachefs --help's options (but
    config= itself) mounts, and kcache config --json shows each; a new option must be added here."""
    import re
    d = workdir[0]
    auth = os.path.join(private_dir(d), "redis.auth")
    with open(auth, "w") as f:
        f.write("pw\n")
    os.chmod(auth, 0o600)
    values = {"max_size": ("7M", 7 * M), "low_watermark": ("80", 80), "pin": ("a*:b", "a*:b"),
              "protect": ("writers", "writers"), "layout": ("auto", "auto"), "tmp_age": ("2h", 7200),
              "stale_locks": ("yes", 1), "grace_ms": ("150", 150), "inode_fds": ("64", 64),
              "index": (None, None), "timeout": ("5", 5), "flush_ms": ("100", 100), "log": (None, None),
              "rebuild": ("yes", None), "tighten": ("no", None), "nopassthrough": ("yes", 1), "nouring": ("yes", 1),
              "norefresh": ("yes", 1),
              "nolog": ("no", 0), "remote": ("redis://127.0.0.1:1", "redis://127.0.0.1:1"),
              "remote_auth": (auth, auth), "remote_timeout_ms": ("7", 7), "remote_negative_s": ("9", 9),
              "remote_touch_s": ("2", 2), "herd_wait": ("1", 1), "remote_publish": ("ci", "ci"),
              "remote_publisher": ("root", "root"), "remote_trusted": ("ci:tools", "ci:tools")}
    helped = set(re.findall(r"^\s+-o ([a-z_]+)", subprocess.run([kcachefs_bin(), "--help"], capture_output=True,
                                                                 text=True).stdout.split("FUSE options:")[0], re.M))
    assert helped - {"config"} == set(values), (helped - {"config"}) ^ set(values)
    m = kfs(start=False)
    idx = os.path.join(private_dir(d), "idx")
    os.makedirs(idx)
    values["index"] = (os.path.join(idx, "index.db"), os.path.join(idx, "index.db"))
    values["log"] = (os.path.join(d, "file-given.log"), os.path.join(d, "file-given.log"))
    conf = settings_file(d, "".join(f"{k} = {v}\n" for k, (v, _) in values.items()))
    m.opts = {"config": conf}
    p = m.start(check=False)
    assert p.returncode == 0, p.stderr
    m.index = values["index"][0]  # where the file put it, for stop() to find the daemon's lock
    wait_for(lambda: os.path.ismount(m.mnt), what="mount")
    c = config(m)
    for k, (_, want) in values.items():
        assert k in c, f"kcache config lacks {k}"
        if want is not None:
            assert c[k] == want, (k, c[k], want)


def test_a_settings_line_longer_than_the_parser_reads_is_refused_whole(kfs, workdir):
    """libinih (as Debian builds it) reads 200 bytes of a line and takes the rest for the next line: a long
    pin list was half applied and its tail refused as an unknown setting. The line is refused whole, named."""
    d = workdir[0]
    pins = ":".join(f"pattern{i:03d}*" for i in range(25))
    conf = settings_file(d, f"max_size = 8M\npin = {pins}\n")
    m = kfs({"config": conf}, start=False)
    p = m.start(check=False)
    assert p.returncode != 0 and "kcachefs.conf:2: a line longer than 198 bytes" in p.stderr, p.stderr
    assert not os.path.ismount(m.mnt)
