"""What scripts and monitoring read from kcache: JSON made by json-c (the daemon's stats attribute and
kcache's --json outputs) that parses whatever the paths hold; the Prometheus text format with # HELP and
# TYPE for every metric, escaped labels and the mount's real path, checked by its rules here and by promtool
where it is installed; --output replacing a file atomically; and a failed write is an error (exit 1)."""
import json
import os
import re
import shutil
import subprocess

import pytest

from conftest import Mount, kcache_bin, mount_tmpfs, private_dir

ODD = 'odd "q\\b\nl\udcffz'  # a quote, a backslash, a newline and a byte that is not UTF-8 (surrogateescape)


def kcache(*args, check=True, **kw):
    p = subprocess.run([kcache_bin(), *args], capture_output=True, timeout=60, **kw)
    if check:
        assert p.returncode == 0, p.stderr
    return p


class OddMount(Mount):
    def pid(self):  # the lock file names the mount point, which is not UTF-8
        with open(self.index_path + ".lock", "rb") as f:
            return int(f.read().split()[0])


@pytest.fixture
def odd_mount(workdir):
    """A mount whose backing directory, index and mount point are all under a directory named ODD."""
    d, cleanup = workdir
    top = os.path.join(private_dir(d), ODD)
    backing, mnt = os.path.join(top, "backing"), os.path.join(d, ODD)
    mount_tmpfs(backing, "64m")
    os.chmod(backing, 0o755)
    os.makedirs(mnt)
    cleanup.insert(0, backing)
    cleanup.insert(0, mnt)
    m = OddMount(backing, mnt, {"max_size": "4M"})
    m.start()
    try:
        for n in ("a", "b"):
            with open(m.path(n), "wb") as f:
                f.write(b"k" * 5000)
        yield m
    finally:
        m.stop()


def test_the_daemons_stats_parse_whatever_the_paths_hold(odd_mount):
    m = odd_mount
    raw = os.getxattr(m.mnt, "user.kcachefs.stats")
    s = json.loads(raw.decode("utf-8", "surrogateescape"))  # the paths' bytes as they are (fs/control.c)
    assert s["backing"] == m.backing and s["index"] == m.index_path and s["files"] == 2


def test_kcache_json_is_strict_utf8_and_gives_every_path_back(odd_mount):
    m = odd_mount
    out = kcache("stats", "--json", m.mnt).stdout
    s = json.loads(out.decode("utf-8"))  # strictly UTF-8: the byte that is not is escaped (kcache(1), NAMES)
    assert out.count(b"\n") == 1 and out.endswith(b"}\n")
    assert (s["mount"], s["backing"], s["index"]) == (m.mnt, m.backing, m.index_path)
    assert s["files"] == 2 and s["users"] == [{"uid": 0, "files": 2, "bytes": s["used_bytes"]}]
    rows = json.loads(kcache("ls", "--json", m.mnt).stdout.decode("utf-8"))
    assert sorted(r["path"] for r in rows) == ["a", "b"]
    # verify reads the backing directory from the daemon's JSON: it finds the files there
    p = kcache("verify", m.mnt)
    assert b"matches" in p.stdout, p


def test_json_gives_back_file_names_and_settings_paths_whatever_they_hold(odd_mount):
    """A file named with a quote, a backslash, a newline and a byte that is not UTF-8, in a directory so
    named: ls --json gives both names back byte for byte; config --json the settings' paths (its
    mount, backing directory and index under the odd directory)."""
    m = odd_mount
    os.makedirs(m.path(ODD))
    with open(os.path.join(m.path(ODD), ODD), "wb") as f:
        f.write(b"n" * 3000)
    out = kcache("ls", "--json", m.mnt).stdout
    rows = json.loads(out.decode("utf-8"))  # strict UTF-8 (kcache(1), NAMES)
    assert out.count(b"\n") == len(rows) + 2  # "[", a line a file, "]": the name's newline is escaped
    assert sorted(os.fsencode(r["path"]) for r in rows) == sorted([b"a", b"b", os.fsencode(ODD + "/" + ODD)])
    out = kcache("config", "--json", m.mnt).stdout
    c = json.loads(out.decode("utf-8"))
    assert out.count(b"\n") == 1
    assert (c["mountpoint"], c["backing"], c["index"]) == (m.mnt, m.backing, m.index_path), c
    assert c["max_size"] == 4 << 20
    # Plain: one line a setting, the paths quoted as for a shell (kcache(1), NAMES), no control character.
    plain = kcache("config", m.mnt).stdout
    assert not re.search(rb"[\x00-\x09\x0b-\x1f\x7f]", plain), plain
    keys = [line.split(b" ", 1)[0].decode() for line in plain.splitlines()]
    assert sorted(keys) == sorted(set(c) - {"mount"}), keys
    assert b"$'\\n'" in plain and b"$'\\377'" in plain, plain


PROM_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*$")
PROM_SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
PROM_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:\\[\\"n]|[^"\\\n])*)"(,|$)')


def prom_check(text):
    """The text exposition format's rules, as kcache promises them: every sample's family has one # HELP
    and one # TYPE line before it (and none after its samples began), names and label names are valid,
    label values use only the three escapes, counters end in _total. Returns [(name, labels, value)]."""
    helped, typed, started, samples = {}, {}, set(), []
    assert text.endswith("\n")
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            kind, name, rest = line[2:6], *line[7:].split(" ", 1)
            assert PROM_NAME.match(name), line
            table = helped if kind == "HELP" else typed
            assert name not in table and name not in started, f"second {kind} for {name}, or after its samples"
            table[name] = rest
            if kind == "TYPE":
                assert rest in ("counter", "gauge"), line
                assert (rest == "counter") == name.endswith("_total"), line
            continue
        assert not line.startswith("#"), line
        g = PROM_SAMPLE.match(line)
        assert g, line
        name, labels, value = g.groups()
        assert name in helped and name in typed, f"{name}: no HELP or TYPE before its sample"
        started.add(name)
        got, rest = {}, labels or ""
        while rest:
            lm = PROM_LABEL.match(rest)
            assert lm, line
            got[lm.group(1)] = re.sub(r'\\([\\"n])', lambda x: "\n" if x.group(1) == "n" else x.group(1), lm.group(2))
            rest = rest[lm.end():]
        assert int(value) >= 0
        samples.append((name, got, int(value)))
    return samples


def test_prometheus_has_help_and_type_and_the_real_mount_path(odd_mount):
    m = odd_mount
    link = os.path.join(os.path.dirname(m.mnt), "link")
    os.symlink(m.mnt, link)
    out = kcache("stats", "--prometheus", link).stdout
    samples = prom_check(out.decode("utf-8"))
    real = os.path.realpath(m.mnt).replace("\udcff", "\ufffd")  # not UTF-8: U+FFFD (kcache(1), NAMES)
    assert len(samples) > 20 and all(lab["mount"] == real for _, lab, _ in samples), samples[:3]
    got = {n: v for n, _, v in samples}
    assert got["kcachefs_files"] == 2 and got["kcachefs_max_bytes"] == 4 << 20
    assert ("kcachefs_user_used_bytes", {"mount": real, "uid": "0"}, got["kcachefs_used_bytes"]) in samples


def promtool():
    """promtool from PATH, or the copy scripts/install-deps unpacks for the tests (no service, no 96 MB
    install): $KCACHEFS_PROMTOOL or /var/cache/kcachefs-test/promtool."""
    for p in (os.environ.get("KCACHEFS_PROMTOOL"), shutil.which("promtool"),
              "/var/cache/kcachefs-test/promtool"):
        if p and os.access(p, os.X_OK):
            return p
    return None


@pytest.mark.skipif(not promtool(), reason="promtool is not installed (scripts/install-deps unpacks it; "
                                           "the format's rules are checked without it above)")
def test_promtool_check_metrics_is_clean(odd_mount):
    out = kcache("stats", "--prometheus", odd_mount.mnt).stdout
    p = subprocess.run([promtool(), "check", "metrics"], input=out, capture_output=True, timeout=60)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), (p.stdout, p.stderr)


@pytest.mark.parametrize("args", [["stats", "--prometheus"], ["stats", "--json"], ["stats"], ["ls", "--json"],
                                  ["ls"], ["config", "--json"], ["config"]])
def test_a_failed_write_is_an_error(odd_mount, args):
    with open("/dev/full", "wb") as full:
        p = subprocess.run([kcache_bin(), *args, odd_mount.mnt], stdout=full, stderr=subprocess.PIPE, timeout=60)
    assert p.returncode == 1 and b"No space left on device" in p.stderr, p


def test_output_replaces_the_file_whole(odd_mount, workdir):
    m = odd_mount
    d = os.path.join(workdir[0], "textfile")
    os.makedirs(d)
    target = os.path.join(d, "kcachefs.prom")
    with open(target, "w") as f:
        f.write("old\n")
    before = os.stat(target).st_ino
    old_umask = os.umask(0o022)
    try:
        kcache("stats", "--prometheus", "-o", target, m.mnt)
    finally:
        os.umask(old_umask)
    st = os.stat(target)
    assert st.st_ino != before, "written in place: a reader could see it half written"
    assert st.st_mode & 0o777 == 0o644  # the node exporter's user reads it
    assert os.listdir(d) == ["kcachefs.prom"]  # the temporary file is gone
    with open(target) as f:
        written = [(n, lab) for n, lab, _ in prom_check(f.read())]  # the counters move between two readings
    assert written == [(n, lab) for n, lab, _ in prom_check(kcache("stats", "--prometheus", m.mnt).stdout.decode())]
    kcache("stats", "--json", "--output", target, m.mnt)
    with open(target, "rb") as f:
        assert json.loads(f.read())["files"] == 2


def test_output_that_cannot_be_written_leaves_the_old_file(odd_mount, workdir):
    """On a full filesystem the new text does not fit: exit 1, the old file is intact, no temporary is
    left (the temporary is never the target)."""
    m = odd_mount
    d = os.path.join(workdir[0], "small")
    mount_tmpfs(d, "64k")
    workdir[1].insert(0, d)
    target = os.path.join(d, "kcachefs.prom")
    with open(target, "w") as f:
        f.write("old\n")
    with open(os.path.join(d, "filler"), "wb", buffering=0) as f:
        with pytest.raises(OSError):
            while True:
                f.write(b"x" * 4096)
    p = kcache("stats", "--prometheus", "-o", target, m.mnt, check=False)
    assert p.returncode == 1 and b"kcachefs.prom" in p.stderr and b"No space left" in p.stderr, p
    with open(target) as f:
        assert f.read() == "old\n"
    assert sorted(os.listdir(d)) == ["filler", "kcachefs.prom"]


def test_output_needs_a_machine_format(odd_mount):
    p = kcache("stats", "-o", "/dev/null", odd_mount.mnt, check=False)
    assert p.returncode == 2 and b"--output needs --json or --prometheus" in p.stderr, p
