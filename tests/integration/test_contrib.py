"""What operators use, run for real: the fstab line through mount(8) and mount.fuse3, the systemd unit's
command lines as systemd would expand them, the job prolog, and the module files' variables."""
import os
import re
import shlex
import socket
import subprocess

import pytest

from conftest import ROOT, kcachefs_bin, private_dir, wait_for

CONTRIB = os.path.join(ROOT, "contrib")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting through mount(8) needs root")


@pytest.fixture
def installed_binary():
    """mount(8) runs helpers with a fixed PATH: put the binary under test where it looks."""
    link = "/usr/local/sbin/kcachefs"
    if os.path.exists(link) and not os.path.islink(link):
        pytest.skip("a real kcachefs is installed in /usr/local/sbin")
    old = os.readlink(link) if os.path.islink(link) else None
    if old is not None:
        os.unlink(link)
    os.symlink(os.path.abspath(kcachefs_bin()), link)
    yield link
    os.unlink(link)
    if old is not None:
        os.symlink(old, link)


def size_of(mnt):
    s = os.statvfs(mnt)
    return s.f_blocks * s.f_frsize


@needs_root
def test_fstab_line_mounts_through_mount_fuse3(workdir, installed_binary):
    d, cleanup = workdir
    line = next(l for l in open(os.path.join(CONTRIB, "fstab.example")) if l.strip() and not l.startswith("#"))
    backing, mnt, fstype, opts, _, _ = line.split()
    assert fstype == "fuse.kcachefs"
    backing, mnt = os.path.join(private_dir(d), "fb"), os.path.join(d, "fm")
    os.makedirs(backing)
    os.makedirs(mnt)
    cleanup.insert(0, mnt)
    subprocess.run(["mount", "-t", fstype, "-o", opts, backing, mnt], check=True, capture_output=True)
    wait_for(lambda: os.path.ismount(mnt), what="mount")
    assert size_of(mnt) == 50 << 30
    # The line is safe as written: a shared mount, checked by the kernel, with no setuid file or device.
    assert {"allow_other", "default_permissions"} <= set(opts.split(","))
    with open("/proc/self/mountinfo") as f:
        info = next(l.split() for l in f if l.split()[4] == mnt)
    assert {"nosuid", "nodev"} <= set(info[5].split(",")), info
    assert {"allow_other", "default_permissions"} <= set(info[-1].split(",")), info
    with open(os.path.join(mnt, "x"), "w") as f:
        f.write("through fstab")
    subprocess.run(["umount", mnt], check=True)
    assert open(os.path.join(backing, "x")).read() == "through fstab"


def systemd_expand(cmd, env, mountpoint, instance="unit-inst"):
    cmd = cmd.replace("%%", "\0").replace("%f", mountpoint).replace("%i", instance).replace("\0", "%")
    # ${VAR} is the variable's value, $$ a shell's $
    return [re.sub(r"\$\$|\$\{(\w+)\}", lambda m: "$" if m.group(0) == "$$" else env[m.group(1)], w)
            for w in shlex.split(cmd)]


@needs_root
def test_systemd_unit_command_lines(workdir):
    d, cleanup = workdir
    unit = open(os.path.join(CONTRIB, "systemd", "kcachefs@.service.in")).read()
    keys = dict(re.findall(r"^(Exec\w+)=(.*)$", unit, re.M))
    env = dict(re.findall(r"^Environment=(\w+)=(.*)$", unit, re.M))
    assert {"ExecStartPre", "ExecStart", "ExecStop", "ExecReload"} <= set(keys)
    assert re.search(r"^Restart=on-failure$", unit, re.M)
    mnt = os.path.join(d, "unit-mnt")
    # The instance's settings file (backing = ..., max_size = ...) says the backing directory; written at
    # the first start when missing, with one backing directory per instance (%i: the escaped mount point),
    # not the mount point appended to a path (%f gave /var/cache/kcachefs/backing/var/cache/kcachefs/mnt).
    assert env["KCACHEFS_CONF"] == "/etc/kcachefs/%i.conf"
    assert "backing = /var/cache/kcachefs/private/%%s" in keys["ExecStartPre"]
    assert keys["ExecStartPre"].endswith(" kcachefs-prepare ${KCACHEFS_CONF} %i %f")
    backing = os.path.join(d, "unit", "backing")
    env["KCACHEFS_CONF"] = os.path.join(d, "unit.conf")  # as /etc/kcachefs/<instance>.env may set
    with open(env["KCACHEFS_CONF"], "w") as f:
        f.write(f"backing = {backing}\nmax_size = 10G\n")
    cleanup.insert(0, mnt)
    subprocess.run(systemd_expand(keys["ExecStartPre"], env, mnt), check=True)
    # The backing's parent is made closed: only root reaches the backing directory.
    assert os.stat(os.path.join(d, "unit")).st_mode & 0o7777 == 0o700
    assert os.path.isdir(backing) and os.path.isdir(mnt)
    start = systemd_expand(keys["ExecStart"].replace("@SBINDIR@/kcachefs", kcachefs_bin()), env, mnt)
    # Type=notify, in the foreground: systemd keeps its stderr (the journal) and waits for READY=1.
    assert re.search(r"^Type=notify$", unit, re.M) and "-f" in start
    sock_path = os.path.join(d, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(30)
    p = subprocess.Popen(start, stderr=subprocess.PIPE, text=True, env=dict(os.environ, NOTIFY_SOCKET=sock_path))
    try:
        assert sock.recv(256) == b"READY=1"
        assert os.path.ismount(mnt)  # READY=1 comes once it serves
        assert size_of(mnt) == 10 << 30
        # systemctl reload: the settings file again (SIGHUP), the mount stays.
        with open(env["KCACHEFS_CONF"], "w") as f:
            f.write(f"backing = {backing}\nmax_size = 12G\n")
        subprocess.run([w.replace("$MAINPID", str(p.pid)) for w in systemd_expand(keys["ExecReload"], env, mnt)],
                       check=True)
        wait_for(lambda: size_of(mnt) == 12 << 30, what="the reloaded max_size")
        assert p.poll() is None and os.path.ismount(mnt)
        subprocess.run(systemd_expand(keys["ExecStop"], env, mnt), check=True)
        assert sock.recv(256) == b"STOPPING=1"
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
        sock.close()
    assert p.returncode == 0, err
    assert not os.path.ismount(mnt)
    assert f"mounted {backing} on {mnt}" in err, err
    assert "the index is flushed and marked clean" in err, err


@needs_root
def test_job_prolog_mounts_once_without_shared_runtime_dirs(workdir):
    d, cleanup = workdir
    env = dict(os.environ, KCACHEFS_BACKING=os.path.join(d, "node", "pb"), KCACHEFS_MOUNT=os.path.join(d, "pm"),
               KCACHEFS_BIN=os.path.abspath(kcachefs_bin()), KCACHEFS_OPTIONS="max_size=1G,allow_other")
    cleanup.insert(0, env["KCACHEFS_MOUNT"])
    prolog = os.path.join(CONTRIB, "hpc", "prolog-kcachefs.sh")
    for _ in range(2):  # idempotent: the second job on the node finds it mounted
        subprocess.run([prolog], env=env, check=True)
    assert os.path.ismount(env["KCACHEFS_MOUNT"])
    # No runtime directory shared by users (a binary one user put there would be loaded by another's
    # process): each user's kcache env gets one of their own (test_security_users.py).
    assert os.listdir(env["KCACHEFS_MOUNT"]) == ["users"]  # the daemon's users/ (0711): no runtime directory


def test_module_files_set_what_kcache_env_sets(kfs):
    """The module files set every variable kcache env sets (by default), to the same values."""
    m = kfs()
    kcache = os.path.join(os.environ.get("KCACHE_BUILD", os.path.join(ROOT, "build")), "kcache")
    out = subprocess.run([kcache, "env", m.mnt], capture_output=True, text=True, check=True).stdout
    wanted = {}
    for line in out.splitlines():
        for var, val in re.findall(r"([A-Z_]+)=('[^']*'|[^ ;]+)", line):
            wanted[var] = val.strip("'").replace(m.mnt, "MNT")
    assert len(wanted) >= 20, wanted
    lua = open(os.path.join(CONTRIB, "modulefiles", "kcachefs.lua")).read()
    tcl = open(os.path.join(CONTRIB, "modulefiles", "kcachefs.tcl")).read()
    for var, val in wanted.items():
        sub = val.split("MNT/")[1] if val.startswith("MNT/") else None
        assert (f'setenv("{var}", pathJoin(base, "{sub}"))' if sub else f'setenv("{var}", "{val}")') in lua, var
        assert (f"setenv {var} $base/{sub}\n" if sub else f"setenv {var} {val}\n") in tcl, var
    # base: where kcache env put the runtimes' directories (on a shared mount, the user's own), from its output
    assert "capture(\"kcache env '\" .. mnt" in lua and "KCACHE_DIR='([^']*)/kcache'" in lua
    assert "exec kcache env $mnt" in tcl and "{KCACHE_DIR='([^']*)/kcache'}" in tcl
    assert 'unsetenv("SYCL_CACHE_MAX_SIZE")' in lua and "unsetenv SYCL_CACHE_MAX_SIZE" in tcl


def test_meson_install_puts_everything_in_place(workdir):
    """meson install: daemon, command, libraries, headers, pkg-config files, man pages, unit."""
    d, _ = workdir
    dest = os.path.join(d, "dest")
    build = os.path.join(ROOT, "build")
    subprocess.run(["meson", "install", "-C", build, "--no-rebuild", "--quiet", "--destdir", dest], check=True,
                   capture_output=True)
    prefix = dest + subprocess.run(["meson", "introspect", build, "--buildoptions"], capture_output=True,
                                   text=True, check=True).stdout.split('"name": "prefix"')[1].split('"value": "')[1].split('"')[0]
    found = {os.path.relpath(os.path.join(r, f), prefix) for r, _, fs in os.walk(dest) for f in fs}
    want = ["sbin/kcachefs", "bin/kcache", "include/kcache.h", "include/kcache_cl.h", "include/kcache_ze.h",
            "share/man/man8/kcachefs.8", "share/man/man1/kcache.1", "share/man/man3/libkcache.3",
            "lib/systemd/system/kcachefs@.service"]
    for w in want:
        assert w in found, (w, sorted(found))
    for lib in ("libkcache.so.0", "libkcache-opencl.so.0", "libkcache-level-zero.so.0"):
        assert any(f.endswith(lib) for f in found), lib
    for pc in ("kcache.pc", "kcache-opencl.pc", "kcache-level-zero.pc"):
        assert any(f.endswith("pkgconfig/" + pc) for f in found), pc


@needs_root
def test_the_unit_brings_a_crashed_daemon_back_with_the_backing_its_settings_name(workdir):
    """Restart=on-failure, as systemd runs it: the daemon dies (SIGKILL: the kernel keeps a dead mount,
    "Transport endpoint is not connected"), systemd runs ExecStop (always, once a start succeeded), then
    ExecStartPre and ExecStart again. The new daemon serves the same backing directory, which the settings
    file names, with what was stored before the crash."""
    d, cleanup = workdir
    unit = open(os.path.join(CONTRIB, "systemd", "kcachefs@.service.in")).read()
    keys = dict(re.findall(r"^(Exec\w+)=(.*)$", unit, re.M))
    env = dict(re.findall(r"^Environment=(\w+)=(.*)$", unit, re.M))
    assert re.search(r"^Restart=on-failure$", unit, re.M)
    mnt, backing = os.path.join(d, "crash-mnt"), os.path.join(d, "crash", "backing")
    env["KCACHEFS_CONF"] = os.path.join(d, "crash.conf")
    with open(env["KCACHEFS_CONF"], "w") as f:
        f.write(f"backing = {backing}\nmax_size = 3G\n")
    cleanup.insert(0, mnt)
    sock_path = os.path.join(d, "crash-notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(30)
    start = systemd_expand(keys["ExecStart"].replace("@SBINDIR@/kcachefs", kcachefs_bin()), env, mnt)
    procs = []
    try:
        for run in range(2):
            subprocess.run(systemd_expand(keys["ExecStartPre"], env, mnt), check=True, capture_output=True,
                           timeout=60)
            procs.append(subprocess.Popen(start, stderr=subprocess.PIPE, text=True,
                                          env=dict(os.environ, NOTIFY_SOCKET=sock_path)))
            assert sock.recv(256) == b"READY=1", run
            assert os.path.ismount(mnt) and size_of(mnt) == 3 << 30
            with open("/proc/self/mountinfo") as f:
                assert any(l.split()[4] == mnt and l.split(" - ")[1].split()[1] == backing for l in f)
            if run == 0:
                with open(os.path.join(mnt, "before-the-crash"), "w") as f:
                    f.write("kept")
                procs[0].kill()
                procs[0].communicate(timeout=60)
                # ExecStop after the main process died ($MAINPID unset): the dead mount must go.
                p = subprocess.run(systemd_expand(keys["ExecStop"], env, mnt), capture_output=True, text=True,
                                   timeout=60)
                assert p.returncode == 0, p.stderr
        assert open(os.path.join(mnt, "before-the-crash")).read() == "kept"
        subprocess.run(systemd_expand(keys["ExecStop"], env, mnt), check=True, timeout=60)
        assert sock.recv(256) == b"STOPPING=1"
        _, err = procs[1].communicate(timeout=60)
        assert procs[1].returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        sock.close()
    assert not os.path.ismount(mnt)
