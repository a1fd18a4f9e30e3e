"""kcache's command line: every verb parses its options with getopt_long, names what was wrong, exits 2 on
bad usage and 1 when the operation failed (kcache(1), EXIT STATUS), and never says yes to what it did not
do: a path outside a kcachefs mount is refused before anything is written on it."""
import json
import os
import re
import subprocess

import pytest

from conftest import ROOT
from test_cli_kcache import fill, kcache, kcache_bin

K = 1024

# (arguments, environment, expected exit status, stream, fragment). {mnt} is a started mount holding the
# files f0..f3 (8 KiB each); {backing} its backing directory (outside any mount). A row that names
# neither needs no mount.
CASES = [
    # the global options
    (["-V"], {}, 0, "stdout", "kcache (kcachefs) "),
    (["--version"], {}, 0, "stdout", "kcache (kcachefs) "),
    (["--help"], {}, 0, "stdout", "usage: kcache "),
    (["-h"], {}, 0, "stdout", "usage: kcache "),
    (["help", "evict"], {}, 0, "stdout", "usage: kcache evict MOUNT --to SIZE"),
    ([], {}, 2, "stderr", "usage: kcache "),
    (["--bogus"], {}, 2, "stderr", "kcache: unknown option '--bogus'"),
    (["-x"], {}, 2, "stderr", "kcache: unknown option '-x'"),
    (["frobnicate"], {}, 2, "stderr", "kcache: unknown command 'frobnicate'"),
    # every verb's own --help and -h: its usage on stdout, status 0
    (["stats", "--help"], {}, 0, "stdout", "usage: kcache stats [MOUNT]"),
    (["zero", "-h"], {}, 0, "stdout", "usage: kcache zero [MOUNT]"),
    (["ls", "--help"], {}, 0, "stdout", "usage: kcache ls [MOUNT] [PATH]"),
    (["evict", "-h"], {}, 0, "stdout", "usage: kcache evict MOUNT --to SIZE"),
    (["pin", "--help"], {}, 0, "stdout", "usage: kcache pin PATH..."),
    (["unpin", "--help"], {}, 0, "stdout", "usage: kcache unpin PATH..."),
    (["verify", "--help"], {}, 0, "stdout", "usage: kcache verify [--repair] [MOUNT]"),
    (["env", "--help"], {}, 0, "stdout", "usage: kcache env [MOUNT] [RUNTIME...]"),
    (["show", "--help"], {}, 0, "stdout", "usage: kcache show FILE..."),
    # unknown options and missing values are named
    (["stats", "--bogus", "{mnt}"], {}, 2, "stderr", "kcache: stats: unknown option '--bogus'"),
    (["stats", "-q", "{mnt}"], {}, 2, "stderr", "kcache: stats: unknown option '-q'"),
    (["stats", "--json=yes", "{mnt}"], {}, 2, "stderr", "kcache: stats: option '--json' takes no value"),
    (["stats", "--json", "--prometheus", "{mnt}"], {}, 2, "stderr", "--json or --prometheus, not both"),
    (["stats", "{mnt}", "{mnt}"], {}, 2, "stderr", "kcache: stats: unexpected argument"),
    (["ls", "{mnt}", "-n"], {}, 2, "stderr", "kcache: ls: option '-n' needs a value"),
    (["ls", "-n", "abc", "{mnt}"], {}, 2, "stderr", "kcache: ls: invalid count 'abc' for -n"),
    (["ls", "-n", "-3", "{mnt}"], {}, 2, "stderr", "invalid count '-3'"),
    (["ls", "-n", "0", "{mnt}"], {}, 2, "stderr", "invalid count '0'"),
    (["ls", "-n", "99999999999999999999", "{mnt}"], {}, 2, "stderr", "invalid count"),
    (["ls", "{mnt}", "-n", "2"], {}, 0, "stdout", "PATH (next to be evicted first)"),
    (["evict", "{mnt}", "--to"], {}, 2, "stderr", "kcache: evict: option '--to' needs a value"),
    (["evict", "{mnt}", "--older-than"], {}, 2, "stderr", "kcache: evict: option '--older-than' needs a value"),
    (["evict", "{mnt}", "--older-than", "nan"], {}, 2, "stderr", "invalid duration 'nan' for --older-than"),
    (["evict", "{mnt}", "--older-than", "-5"], {}, 2, "stderr", "invalid duration '-5'"),
    (["evict", "{mnt}", "--older-than", "inf"], {}, 2, "stderr", "invalid duration 'inf'"),
    (["evict", "{mnt}", "--older-than", "soon"], {}, 2, "stderr", "invalid duration 'soon'"),
    (["evict", "{mnt}", "--to", "lots"], {}, 2, "stderr", "kcache: evict: invalid size 'lots' for --to"),
    (["evict", "{mnt}", "--to", "-1"], {}, 2, "stderr", "invalid size '-1'"),
    (["evict", "{mnt}", "--to", "1G", "--older-than", "1d"], {}, 2, "stderr", "--to or --older-than, not both"),
    (["evict", "--to", "1G"], {}, 2, "stderr", "kcache: evict: --to needs the MOUNT"),
    (["evict", "{mnt}", "{mnt}/f0", "--to", "1G"], {}, 2, "stderr", "--to needs the MOUNT"),
    (["evict"], {}, 2, "stderr", "kcache: evict: no PATH"),
    (["evict", "{mnt}", "--to", "1.5G"], {}, 0, "stdout", "evicted 0 files"),
    (["evict", "{mnt}", "--to", "0"], {}, 0, "stdout", "evicted 4 files"),
    (["evict", "{mnt}", "--older-than", "30d"], {}, 0, "stdout", "evicted 0 files"),
    (["pin"], {}, 2, "stderr", "kcache: pin: no PATH"),
    (["unpin", "--bogus", "{mnt}/f0"], {}, 2, "stderr", "kcache: unpin: unknown option '--bogus'"),
    (["verify", "--bogus", "{mnt}"], {}, 2, "stderr", "kcache: verify: unknown option '--bogus'"),
    (["show"], {}, 2, "stderr", "kcache: show: no FILE"),
    (["show", "--bogus", "x"], {}, 2, "stderr", "kcache: show: unknown option '--bogus'"),
    (["zero", "{mnt}", "{mnt}"], {}, 2, "stderr", "kcache: zero: unexpected argument"),
    # env: MOUNT defaults to $KCACHEFS_MOUNT, as for every verb (kcache(1))
    (["env"], {"KCACHEFS_MOUNT": "{mnt}"}, 0, "stdout", "export KCACHE_DIR='{mnt}/kcache'"),
    (["env", "kcache"], {"KCACHEFS_MOUNT": "{mnt}"}, 0, "stdout", "export KCACHE_DIR='{mnt}/kcache'"),
    (["env", "{mnt}", "kcache"], {"KCACHEFS_MOUNT": "/nonexistent"}, 0, "stdout", "export KCACHE_DIR='{mnt}/kcache'"),
    (["env", "--bogus"], {"KCACHEFS_MOUNT": "{mnt}"}, 2, "stderr", "kcache: env: unknown option '--bogus'"),
    (["stats"], {"KCACHEFS_MOUNT": "{mnt}"}, 0, "stdout", "files       4"),
    # a path outside every kcachefs mount: refused, status 1 (the next test shows nothing was written)
    (["pin", "{backing}/f0"], {}, 1, "stderr", "is not in a kcachefs mount"),
    (["unpin", "{backing}/f0"], {}, 1, "stderr", "is not in a kcachefs mount"),
    (["evict", "{backing}/f0"], {}, 1, "stderr", "is not in a kcachefs mount"),
    (["pin", "{mnt}"], {}, 1, "stderr", "not a regular file"),
]


def _id(case):
    args, env, rc, _, _ = case
    return " ".join(args + [f"{k}={v}" for k, v in env.items()]) or "(none)"


def run(args, env_add):
    env = dict(os.environ)
    env.pop("KCACHEFS_MOUNT", None)
    env.update(env_add)
    return subprocess.run([kcache_bin(), *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("args,env,rc,stream,fragment", CASES, ids=[_id(c) for c in CASES])
def test_invocation(kfs, args, env, rc, stream, fragment):
    subst = {}
    if any("{" in a for a in args + list(env.values())):
        m = kfs({"max_size": "4M"})
        fill(m, [f"f{i}" for i in range(4)])
        subst = {"mnt": m.mnt, "backing": m.backing}
    args = [a.format(**subst) for a in args]
    env = {k: v.format(**subst) for k, v in env.items()}
    p = run(args, env)
    out = p.stdout if stream == "stdout" else p.stderr
    assert p.returncode == rc and fragment.format(**subst) in out, (p.returncode, p.stdout, p.stderr)
    if rc == 2 and args and args[0] in ("stats", "ls", "evict", "pin", "unpin", "verify", "env", "show", "zero"):
        assert p.stdout == ""  # bad usage does nothing


@pytest.mark.parametrize("verb", ["pin", "unpin", "evict"])
def test_a_path_outside_a_mount_is_refused_and_nothing_is_written(kfs, verb):
    """The backing directory's files are no mount's: kcache once set user.kcachefs.pinned (or .evict) on them
    directly and said nothing (a pin written there is even taken for the daemon's at a rebuild), and
    unpin removed the daemon's own record of a pin (fs/control.c, PINS) behind its back."""
    m = kfs()
    fill(m, ["x"])
    victim = os.path.join(m.backing, "x")
    if verb == "unpin":
        kcache("pin", m.path("x"))  # the daemon keeps the pin on the backing file too
    ours = {n: os.getxattr(victim, n) for n in os.listxattr(victim) if n.startswith("user.kcachefs")}
    assert ours == ({"user.kcachefs.pinned": b"1"} if verb == "unpin" else {})
    p = run([verb, victim], {})
    assert p.returncode == 1 and f"{victim} is not in a kcachefs mount" in p.stderr, p
    assert {n: os.getxattr(victim, n) for n in os.listxattr(victim) if n.startswith("user.kcachefs")} == ours
    if verb != "unpin":
        for name in ("user.kcachefs.pinned", "user.kcachefs.evict"):
            with pytest.raises(OSError):
                os.getxattr(victim, name)
    assert os.path.exists(m.path("x"))  # and the file in the mount was left alone
    assert os.getxattr(m.path("x"), "user.kcachefs.pinned") == (b"1" if verb == "unpin" else b"0")


def test_a_path_through_a_symlink_into_the_mount_is_acted_on(kfs, tmp_path):
    m = kfs()
    fill(m, ["x"])
    link = tmp_path / "link"
    link.symlink_to(m.path("x"))
    kcache("pin", str(link))
    assert os.getxattr(m.path("x"), "user.kcachefs.pinned") == b"1"
    kcache("unpin", str(link))
    assert os.getxattr(m.path("x"), "user.kcachefs.pinned") == b"0"


@pytest.mark.parametrize("how", [["zero"], ["stats", "-z"], ["stats", "--zero", "--json"]])
def test_zero_resets_the_statistics_and_nothing_else(kfs, how):
    m = kfs({"max_size": "4M"})
    fill(m, [f"f{i}" for i in range(6)])
    for i in range(6):
        open(m.path(f"f{i}"), "rb").read()
    kcache("evict", m.path("f5"))
    before = json.loads(kcache("stats", "--json", m.mnt).stdout)
    assert before["opens"] > 0 and before["evicted_files"] == 1  # bytes_read: 0 under kernel passthrough
    p = kcache(*how, m.mnt)
    if how == ["zero"]:
        assert p.stdout == f"{m.mnt}: statistics zeroed\n"
    else:  # stats -z: the statistics as they are once zeroed
        assert "hits        0 opens" in p.stdout if "--json" not in how else json.loads(p.stdout)["opens"] == 0
    s = json.loads(kcache("stats", "--json", m.mnt).stdout)
    for key in ("opens", "bytes_read", "evicted_files", "evicted_bytes", "rebuilds", "blocked_writes",
                "helped_writes", "background_evictions", "refetches", "refetch_bytes", "suggested_max_bytes",
                "refused_writes", "refused_need_bytes", "passthrough_opens", "fd_reopens", "pruned_names"):
        assert s[key] == 0, (key, s)
    assert s["ring_requests"] < before["ring_requests"] or before["ring_requests"] == 0  # it counts these reads
    # What eviction depends on, the limit and the use, is the daemon's and stays.
    for key in ("max_bytes", "used_bytes", "files", "free_bytes"):
        assert s[key] == before[key], (key, s, before)
    assert "hits        0 opens" in kcache("stats", m.mnt).stdout
    # Counting starts again from zero, and the zeroes outlive a remount (they are the index's).
    open(m.path("f0"), "rb").read()
    m.stop()
    m.start()
    s = json.loads(kcache("stats", "--json", m.mnt).stdout)
    assert s["opens"] == 1 and s["evicted_files"] == 0, s


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create users")
def test_only_the_owner_or_root_may_zero(kfs):
    from conftest import ensure_user
    m = kfs({"allow_other": True, "default_permissions": True})
    ensure_user("kcfs-user2")
    fill(m, ["x"])
    open(m.path("x"), "rb").read()
    p = kcache("zero", m.mnt, check=False, user="kcfs-user2")
    assert p.returncode == 1 and "owner" in p.stderr, p
    assert json.loads(kcache("stats", "--json", m.mnt).stdout)["opens"] > 0


VERBS = ["stats", "remote", "zero", "config", "set", "ls", "evict", "pin", "unpin", "verify", "env", "show"]


def verb_paragraphs(page):
    """{verb: text} of kcache(1)'s DESCRIPTION: each tagged paragraph (.TP, then .B verb or .BR verb ", "
    verb) with the indented ones (.IP) that follow it, fonts taken out."""
    desc = page.split(".SH DESCRIPTION")[1].split("\n.SH ")[0]
    paras = {}
    for e in desc.split("\n.TP\n")[1:]:
        head, _, body = e.partition("\n")
        for verb in re.findall(r"[a-z]+", head.split(None, 1)[1]):
            paras[verb] = re.sub(r"\\f[BIRP]", "", body).replace("\\-", "-")
    return paras


def test_the_man_page_matches_every_verbs_help():
    """kcache(1) shows each verb's synopsis as kcache VERB --help does, and documents each of its options in
    that verb's own paragraph (not merely somewhere in the page: stats -o was found in set's "-o")."""
    page = open(os.path.join(ROOT, "man", "kcache.1")).read()
    paras = verb_paragraphs(page)
    assert set(VERBS) <= set(paras), set(VERBS) - set(paras)
    synopsis = page.split(".SH SYNOPSIS")[1].split(".SH ")[0]
    forms = set()
    for form in re.split(r"^\.br$", synopsis, flags=re.M):  # one form a line, as roff sets it
        form = re.sub(r"^\.(?:B|BR|I|BI|IR)\b ?", "", form, flags=re.M)
        form = re.sub(r"\\f[BIR]", "", form).replace("\\-", "-").replace('"', "")
        forms.add(" ".join(form.split()).lower())
    documented = re.sub(r"\\f[BIR]|\\", "", page)
    for verb in VERBS:
        h = subprocess.run([kcache_bin(), verb, "--help"], capture_output=True, text=True, check=True).stdout
        for line in h.split("\n\n")[0].splitlines():  # the usage lines: "usage: kcache VERB ..." then "       kcache VERB ..."
            form = " ".join(line.replace("usage:", "").split())
            assert form.lower() in forms, (form, forms)
        for opt in set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-zA-Z])\b", h)) - {"-h", "--help"}:
            assert re.search(rf"(?<![\w-]){re.escape(opt)}\b", paras[verb]), (verb, opt, paras[verb])
    top = subprocess.run([kcache_bin(), "--help"], capture_output=True, text=True, check=True).stdout
    assert " ".join(top.splitlines()[0].replace("usage:", "").split()).lower() in forms
    assert "-V, --version" in top and "-V" in documented and "--version" in documented
    assert "0 ok, 1 the operation failed, 2 bad usage" in top
    status = page.split(".SH EXIT STATUS")[1].split(".SH ")[0]
    assert re.findall(r"^\.B (\d)$", status, re.M) == ["0", "1", "2"] and "Bad usage" in status


def test_the_readme_shows_every_verb_as_its_help_does_and_its_settings_example_runs(kfs, tmp_path):
    """README.md's operations section: its summary of kcache has each verb of kcache --help, in the form of
    the verb's usage line where it gives one; the example of "Changing settings of a running mount" (kcache
    set, then kcache config) runs as written against a mount at ~/.cache/kcachefs/mnt and does what it says."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    ops = readme.split("## Inspecting and managing a cache")[1].split("\n## ")[0]
    summary = ops.split("```\n")[1]
    said = {line.split()[1]: " ".join(line.split()) for line in summary.splitlines() if line.startswith("kcache ")}
    for verb in VERBS:
        said_verb = said.get(verb) or next((v for k, v in said.items() if f"kcache {verb} " in v), None)
        assert said_verb, f"README's summary lacks kcache {verb}"
        usage = subprocess.run([kcache_bin(), verb, "--help"], capture_output=True, text=True, check=True).stdout
        form = " ".join(usage.splitlines()[0].replace("usage:", "").split())
        if verb not in ("evict", "pin", "unpin"):  # those two lines sum several forms up
            assert said_verb.startswith(form), (said_verb, form)
    # The textfile collector: Debian's directory (not upstream's), written whole with -o (never with >).
    assert "kcache stats --prometheus -o /var/lib/prometheus/node-exporter/kcachefs.prom" in ops
    assert not re.search(r"--prometheus[^\n`]*>", readme) and "/var/lib/node_exporter" not in readme
    example = ops.split("### Changing settings of a running mount")[1].split("```sh\n")[1].split("```")[0]
    assert "kcache set" in example and "kcache config" in example
    m = kfs({"max_size": "8M"})
    home = tmp_path / "home"
    (home / ".cache" / "kcachefs").mkdir(parents=True)
    os.symlink(m.mnt, home / ".cache" / "kcachefs" / "mnt")
    env = dict(os.environ, HOME=str(home), PATH=os.path.dirname(os.path.abspath(kcache_bin())) + ":" + os.environ["PATH"])
    p = subprocess.run(["bash", "-ec", example], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "max_size 21474836480 (was 8388608)" in p.stdout and "20.0 GiB" in p.stdout, p.stdout
