"""The command line: --help, --version, and bad input that must fail with one clear line, changing nothing."""
import os
import subprocess

import pytest

from conftest import Mount, kcachefs_bin, mount_tmpfs, private_dir


def run(*args):
    return subprocess.run([kcachefs_bin(), *args], capture_output=True, text=True, timeout=60)


def test_help_lists_our_options_and_fuse_options():
    p = run("--help")
    assert p.returncode == 0
    for word in ("max_size=", "low_watermark=", "pin=", "index=", "protect=", "allow_other", "-f"):
        assert word in p.stdout + p.stderr


def test_version():
    p = run("--version")
    assert p.returncode == 0
    assert "kcachefs version" in p.stdout
    assert "FUSE library version" in p.stdout + p.stderr


def one_error_line(p, *needles):
    assert p.returncode != 0
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("kcachefs: "), p.stderr
    for n in needles:
        assert n in lines[0], p.stderr


@pytest.fixture
def dirs(workdir):
    d, cleanup = workdir
    b, m = os.path.join(d, "b"), os.path.join(d, "m")
    os.makedirs(b)
    os.makedirs(m)
    return d, b, m


def untouched(b):
    assert os.listdir(b) == []


def test_missing_operands(dirs):
    d, b, m = dirs
    one_error_line(run(b), "MOUNTPOINT")


def test_missing_backing(dirs):
    d, b, m = dirs
    one_error_line(run(os.path.join(d, "nope"), m), "does not exist")


def test_backing_not_a_directory(dirs):
    d, b, m = dirs
    f = os.path.join(d, "file")
    open(f, "w").close()
    one_error_line(run(f, m), "not a directory")


def test_unwritable_backing(dirs, workdir):
    d, b, m = dirs
    ro = os.path.join(d, "ro")
    mount_tmpfs(ro, "1m", "ro")
    workdir[1].insert(0, ro)
    one_error_line(run(ro, m), "not writable")


def test_backing_on_overlayfs(dirs, workdir):
    # Containers' root filesystems are overlayfs: its files report the layer's device and inode number,
    # not the directory's, so one cache keyed by inode cannot live there. Refused with the way out.
    d, b, m = dirs
    layers = os.path.join(d, "layers")
    mount_tmpfs(layers, "8m", "rw")
    workdir[1].insert(0, layers)
    for x in ("lower", "upper", "work"):
        os.makedirs(os.path.join(layers, x))
    merged = os.path.join(d, "merged")
    os.makedirs(merged)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={layers}/lower,upperdir={layers}/upper,workdir={layers}/work", merged], check=True)
    workdir[1].insert(0, merged)
    one_error_line(run(merged, m), "overlayfs", "bind mount")
    untouched(merged)


@pytest.mark.parametrize("size,word", [("0", "more than zero"), ("12Q", "expected a number"), ("abc", "expected a number"),
                                        ("", "expected a number"), ("99999999999999999999", "too large"),
                                        ("99999999999T", "too large")])
def test_bad_sizes(dirs, size, word):
    d, b, m = dirs
    one_error_line(run("-o", f"max_size={size}", b, m), "max_size", word)
    untouched(b)


@pytest.mark.parametrize("opt,word", [("low_watermark=0", "low_watermark"), ("low_watermark=101", "low_watermark"),
                                       ("low_watermark=x", "low_watermark"), ("protect=some", "protect")])
def test_bad_options(dirs, opt, word):
    d, b, m = dirs
    one_error_line(run("-o", opt, b, m), word)
    untouched(b)


def test_mountpoint_inside_backing(dirs):
    d, b, m = dirs
    inner = os.path.join(b, "inner")
    os.makedirs(inner)
    one_error_line(run(b, inner), "inside the backing directory")
    assert os.listdir(b) == ["inner"]


def test_backing_inside_mountpoint(dirs):
    d, b, m = dirs
    inner = os.path.join(m, "inner")
    os.makedirs(inner)
    one_error_line(run(inner, m), "inside the mount point")
    one_error_line(run(b, b), "inside")


def test_index_inside_backing_refused(dirs):
    d, b, m = dirs
    one_error_line(run("-o", f"index={b}/idx.db", b, m), "inside the backing directory")
    untouched(b)


def test_index_in_missing_directory(dirs):
    d, b, m = dirs
    one_error_line(run("-o", f"index={d}/none/idx.db", b, m), "does not exist")
    untouched(b)


def test_index_in_use_by_another_daemon(kfs, workdir):
    first = kfs()
    d, cleanup = workdir
    other = os.path.join(d, "other-mnt")
    os.makedirs(other)
    second = Mount(first.backing, other)
    p = second.start(check=False)
    one_error_line(p, "in use by another kcachefs", f"pid {first.pid()}")
    assert not os.path.ismount(other)
    # The first one still serves.
    with open(first.path("still"), "w") as f:
        f.write("ok")
    assert open(first.path("still")).read() == "ok"


def test_index_elsewhere_and_on_read_only_place(kfs, workdir):
    d, cleanup = workdir
    idxdir = os.path.join(private_dir(d), "idx")
    os.makedirs(idxdir)
    m = kfs(index=os.path.join(idxdir, "cache.db"))
    with open(m.path("x"), "w") as f:
        f.write("x" * 5000)
    m.stop()
    assert os.path.exists(os.path.join(idxdir, "cache.db"))
    assert not os.path.exists(os.path.join(m.backing, ".kcachefs"))
    assert m.index_rows() == {"x": 8192} or m.index_rows() == {"x": 4096 * 2}

    ro = os.path.join(d, "roidx")
    mount_tmpfs(ro, "1m", "ro")
    cleanup.insert(0, ro)
    bad = Mount(m.backing, m.mnt, index=os.path.join(ro, "i.db"))
    one_error_line(bad.start(check=False), "not writable")


def test_an_index_of_the_previous_schema_is_upgraded_in_place(kfs):
    """Version 1 (before the eviction intents) opens, keeps its files and recency, and becomes version 2."""
    import sqlite3
    m = kfs({"max_size": "64M"})
    for i in range(5):
        with open(m.path(f"f{i}"), "wb") as f:
            f.write(b"x" * 5000)
    m.stop()
    db = sqlite3.connect(m.index_path)
    seqs = dict(db.execute("SELECT ino, seq FROM files").fetchall())
    db.execute("DROP TABLE evict_intents")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    p = m.start()
    assert "rebuilt" not in p.stderr, p.stderr  # an upgrade, not a rescan
    m.stop()
    db = sqlite3.connect(m.index_path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    assert db.execute("SELECT count(*) FROM evict_intents").fetchone()[0] == 0
    assert dict(db.execute("SELECT ino, seq FROM files").fetchall()) == seqs
    db.close()


def test_the_man_pages_document_every_option_and_verb_the_programs_take():
    """kcachefs --help's -o options are each an entry of kcachefs(8), and kcache --help's verbs each one
    of kcache(1), and the other way round: a new option or verb without its documentation fails here."""
    import re
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    helptext = subprocess.run([kcachefs_bin(), "--help"], capture_output=True, text=True).stdout
    ours = helptext.split("kcachefs options:")[1].split("FUSE options:")[0]  # not libfuse's own
    opts = set(re.findall(r"^\s+-o ([a-z_]+)", ours, re.M))
    assert {"max_size", "grace_ms", "tmp_age", "layout", "inode_fds"} <= opts, opts
    page = open(os.path.join(root, "man", "kcachefs.8")).read()
    entries = set(re.findall(r"^\.(?:BI|BR|B) ([a-z_]+)", page.split(".SH OPTIONS")[1].split(".SH ")[0], re.M))
    assert opts - entries == set(), f"options of --help missing from kcachefs(8): {opts - entries}"
    assert {e for e in entries if e not in ("allow_other",)} - opts == set(), \
        f"kcachefs(8) documents options --help lacks: {entries - opts}"
    kc = os.path.join(os.environ.get("KCACHE_BUILD", os.path.join(root, "build")), "kcache")
    helptext = subprocess.run([kc, "--help"], capture_output=True, text=True).stdout
    verbs = set(re.findall(r"^  ([a-z]+) ", helptext, re.M)) | set(re.findall(r"\| ([a-z]+) ", helptext))
    page = open(os.path.join(root, "man", "kcache.1")).read()
    documented = set()  # the tagged paragraphs of DESCRIPTION: .TP, then .B verb or .BR verb ", " verb
    for line in re.findall(r"^\.TP\n\.BR? (.*)$", page.split(".SH DESCRIPTION")[1].split(".SH ")[0], re.M):
        documented |= set(re.findall(r"[a-z]+", line))
    assert verbs == documented, (verbs, documented)
