"""The shared tier behind TLS (docs/remote-tls.md): Debian 12's hiredis 0.14 speaks no TLS, so each node
runs a local stunnel4 client tunnel that kcachefs reaches in plain Redis protocol (on 127.0.0.1 or a unix
socket) and that speaks TLS, verifying the server's certificate, to a server that listens on TLS only.

Everything is real: a throwaway CA and server certificate made by openssl in the test's private
directory, Debian's redis-server (built with TLS) with its plain port off and no unix socket, stunnel4 in
the foreground with a configuration file written here, kcachefs mounts as test_remote.py makes them. What
must stay true: a unit published through one node's tunnel is served whole on another's, and a tunnel
that cannot verify the server (another CA) is a counted miss, never an application error, with nothing of
the node's reaching the server."""
import os
import shutil
import socket
import subprocess

import pytest

from conftest import private_dir, wait_for
from test_cli_kcache import kcache
from test_remote import Redis, node, num, pocl_program, published

pytestmark = [
    pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                       reason="needs Debian's redis-server and redis-tools"),
    pytest.mark.skipif(shutil.which("stunnel4") is None, reason="needs Debian's stunnel4"),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
]

SERVER_NAME = "redis.kcachefs.test"  # the name in the server's certificate, that the tunnel checks


def openssl(*args, cwd):
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"openssl {' '.join(args)}: {p.stderr}"


def make_ca(d, name):
    """A throwaway CA in d/<name>/: ca.crt, ca.key. Returns its directory."""
    ca = os.path.join(d, name)
    os.makedirs(ca, mode=0o700)
    openssl("req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", f"/CN=kcachefs test CA {name}", cwd=ca)
    return ca


def make_server_cert(ca, name=SERVER_NAME):
    """A server certificate for name (and 127.0.0.1) signed by ca: ca/server.crt, ca/server.key."""
    with open(os.path.join(ca, "server.ext"), "w") as f:
        f.write(f"basicConstraints = CA:FALSE\nkeyUsage = digitalSignature, keyEncipherment\n"
                f"extendedKeyUsage = serverAuth\nsubjectAltName = DNS:{name}, IP:127.0.0.1\n")
    openssl("req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={name}", cwd=ca)
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "server.ext", cwd=ca)
    return os.path.join(ca, "server.crt"), os.path.join(ca, "server.key")


def free_port():
    """A port nothing listens on now (the kernel's choice); its user binds it next, and checks it did."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TlsRedis(Redis):
    """Debian's redis-server on TLS only: --port 0 and no unix socket, so that the only way in is TLS.
    redis-cli reaches it through TLS too, verifying it against the CA."""

    def __init__(self, d, ca):
        super().__init__(d)
        self.ca = ca
        self.cert, self.key = make_server_cert(ca)
        self.tls_port = None

    def start(self):
        for _ in range(5):  # another process may take the chosen port first: choose again
            self.tls_port = free_port()
            args = ["redis-server", "--port", "0", "--tls-port", str(self.tls_port), "--bind", "127.0.0.1",
                    "--tls-cert-file", self.cert, "--tls-key-file", self.key,
                    "--tls-ca-cert-file", os.path.join(self.ca, "ca.crt"), "--tls-auth-clients", "no",
                    "--save", "", "--appendonly", "no", "--dir", self.dir, "--daemonize", "no",
                    "--maxmemory-policy", "allkeys-lru"]
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_for(lambda: self.proc.poll() is not None or self.cli("PING").strip() == "PONG",
                     what="redis-server on TLS")
            if self.proc.poll() is None:
                return self
        raise AssertionError("redis-server could not listen on TLS")

    def cli(self, *args, raw=False, stdin=None):
        p = subprocess.run(["redis-cli", "--tls", "--cacert", os.path.join(self.ca, "ca.crt"), "--sni", SERVER_NAME,
                            "-h", "127.0.0.1", "-p", str(self.tls_port)]
                           + (["-x"] if stdin is not None else []) + list(args),
                           capture_output=True, timeout=30, input=stdin)
        return p.stdout if raw else p.stdout.decode(errors="replace")

    @property
    def url(self):
        raise AssertionError("a TLS-only server is reached through a Tunnel's url")


class Tunnel:
    """One node's stunnel4 client, in the foreground: accepts plain Redis protocol on 127.0.0.1:PORT
    (accept="tcp") or on a unix socket (accept="unix"), and speaks TLS to the server, verifying its chain
    against cafile and its name against SERVER_NAME. Its log (stderr) is self.log."""

    def __init__(self, d, name, cafile, server_port, accept="tcp"):
        self.dir = os.path.join(d, name)
        os.makedirs(self.dir, mode=0o700)
        self.cafile = cafile
        self.server_port = server_port
        self.accept = accept
        self.conf = os.path.join(self.dir, "stunnel.conf")
        self.log = os.path.join(self.dir, "stunnel.log")
        self.sock = os.path.join(self.dir, "redis.sock")
        self.port = None
        self.proc = None

    def _state(self):
        """"up" once stunnel says it listens, "failed" if it could not; None while it starts. Read from its
        log, not by connecting: a probe's connection would verify the server too, and the tests read the
        log for what the node's connections did."""
        if self.proc.poll() is not None:
            return "failed"
        log = self.text()
        if "Error binding" in log or ("Binding service" in log and "failed" in log):
            return "failed"
        return "up" if "Accepting new connections" in log else None

    def start(self):
        for _ in range(5):  # another process may take the chosen port first: choose again
            self.port = free_port()
            with open(self.conf, "w") as f:
                f.write(f"""foreground = yes
pid =
syslog = no
debug = info

[redis]
client = yes
accept = {self.sock if self.accept == "unix" else f"127.0.0.1:{self.port}"}
connect = 127.0.0.1:{self.server_port}
sni = {SERVER_NAME}
verifyChain = yes
CAfile = {self.cafile}
checkHost = {SERVER_NAME}
""")
            with open(self.log, "wb") as log:
                self.proc = subprocess.Popen(["stunnel4", self.conf], stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=log)
            if wait_for(self._state, what="stunnel4 listening") == "up":
                return self
            self.stop()
        raise AssertionError(f"stunnel4 did not start:\n{self.text()}")

    def text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    @property
    def url(self):
        return f"unix:{self.sock}" if self.accept == "unix" else f"redis://127.0.0.1:{self.port}"


@pytest.fixture
def tls(workdir):
    """A TLS-only server and a maker of tunnels to it (tunnel(name, cafile=None, accept="tcp")), all in
    workdir's private directory; every process killed at the end, even on failure."""
    d, _ = workdir
    pd = private_dir(d)
    ca = make_ca(pd, "ca")
    server = TlsRedis(os.path.join(pd, "redis"), ca)
    os.makedirs(server.dir, mode=0o700)
    tunnels = []

    def tunnel(name, cafile=None, accept="tcp"):
        t = Tunnel(pd, name, cafile or os.path.join(ca, "ca.crt"), server.tls_port, accept)
        tunnels.append(t)
        return t.start()

    try:
        server.start()
        tunnel.server = server
        tunnel.dir = pd
        yield tunnel
    finally:
        for t in tunnels:
            t.stop()
        server.stop()


# The tunnel on 127.0.0.1:PORT (this test found the daemon dropping the port of redis://HOST:PORT) and on
# a unix socket.
ACCEPTS = ["tcp", "unix"]


def through(m, t):
    """m's remote is t's accept address, as kcachefs understood the option (kcache stats' remote line)."""
    line = next(l for l in kcache("stats", m.mnt).stdout.splitlines() if l.startswith("remote"))
    where = line.split()[1].rstrip(":")
    assert where == (f"unix:{t.sock}" if t.accept == "unix" else f"redis://127.0.0.1:{t.port}/0"), line
    return m


def marker_of(files):
    return next(p for p in files if p.endswith("program.bc"))


@pytest.mark.parametrize("accept", ACCEPTS)
def test_a_unit_published_through_a_tls_tunnel_is_served_whole_on_another_node(kfs, tls, accept):
    server = tls.server
    # the server takes TLS only: plain protocol on its port gets no answer
    plain = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(server.tls_port), "PING"],
                           capture_output=True, text=True, timeout=30)
    assert "PONG" not in plain.stdout
    assert server.cli("CONFIG", "GET", "port").split() == ["port", "0"]
    ta, tb = tls("tunnel-a", accept=accept), tls("tunnel-b", accept=accept)  # each node its own tunnel
    a, b = through(node(kfs, ta), ta), through(node(kfs, tb), tb)
    files = pocl_program(a.path("pocl"), "tls1")
    published(a)
    marker = marker_of(files)
    assert server.cli("EXISTS", f"kcfs:1:u{os.getuid()}:pocl/{marker}").strip() == "1"  # stored, over TLS
    with open(os.path.join(b.path("pocl"), marker), "rb") as f:  # B's PoCL probes program.bc
        assert f.read() == files[marker]
    for rel, data in files.items():  # the whole unit is there, as A has it
        with open(os.path.join(b.path("pocl"), rel), "rb") as f:
            assert f.read() == data, rel
    assert num(b, "remote_hits") == 1
    for m in (a, b):
        assert num(m, "remote_errors") == 0 and num(m, "remote_timeouts") == 0
        assert "matches" in kcache("verify", m.mnt).stdout
    for t in (ta, tb):  # each node went through its tunnel, which verified the server's chain and name
        log = t.text()
        assert "accepted connection from" in log and "Certificate accepted at depth=0" in log, log[-2000:]
        assert f'Host name "{SERVER_NAME}" matched' in log, log[-2000:]


@pytest.mark.parametrize("accept", ACCEPTS)
def test_a_tunnel_that_cannot_verify_the_server_is_a_counted_miss(kfs, tls, accept):
    """A tunnel that trusts another CA refuses the server's certificate and drops each connection: every
    lookup is a counted miss, the local tier stores and loads as without a remote, nothing reaches the
    server."""
    server = tls.server
    other = make_ca(tls.dir, "other-ca")
    t = tls("tunnel-wrong-ca", cafile=os.path.join(other, "ca.crt"), accept=accept)
    a = through(node(kfs, t, remote_timeout_ms="200"), t)
    for i in range(20):
        assert not os.path.exists(os.path.join(a.path("pocl"), f"x{i}"))
    assert num(a, "remote_errors") + num(a, "remote_timeouts") > 0
    assert num(a, "remote_hits") == 0
    files = pocl_program(a.path("pocl"), "local")  # stores and loads locally, no application error
    for rel, data in files.items():
        with open(os.path.join(a.path("pocl"), rel), "rb") as f:
            assert f.read() == data
    # the publisher tries the server for the unit, and fails (a counted error, nothing stored)
    before = num(a, "remote_errors") + num(a, "remote_timeouts")
    wait_for(lambda: num(a, "remote_errors") + num(a, "remote_timeouts") > before, timeout=20,
             what="the publisher's attempt counted")
    assert num(a, "remote_publishes") == 0
    assert server.cli("DBSIZE").strip() == "0"
    assert "matches" in kcache("verify", a.mnt).stdout
    # it failed for the reason given: the node's connections reached the tunnel, which refused the server
    log = t.text()
    assert "accepted connection from" in log, log[-2000:]
    assert "Certificate accepted" not in log and "certificate verify failed" in log, log[-2000:]
