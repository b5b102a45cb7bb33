"""The fork server against another local user, and a start that must see only itself (issue 23).

The attacker is a throwaway system user of the test's own, running the system's Python: it binds
the server's abstract name while no server holds it (any user may), or connects to root's
server. No cluster needed; run under `flock /tmp/commscope-itest.lock` as the other process
tests are."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_forkserver import _env, _forkserver, _launch, _launch_args, probe_dir

__all__ = ["other_user", "probe_dir", "run_as"]

SYSTEM_PYTHON = "/usr/bin/python3"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
    reason="needs root (a throwaway user) and the system's python3",
)

# Binds the name in argv[1], takes one connection, answers as a fork server would (ranks
# started, all ended well) and prints what it received: what a launch would have leaked.
SQUATTER = r"""
import json, socket, sys
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind("\0" + sys.argv[1]); srv.listen(4)
print("listening", flush=True)
srv.settimeout(60)
got = b""
try:
    conn, _ = srv.accept()
    conn.settimeout(5)
    try:
        while b"\n" not in got:
            data = conn.recv(65536)
            if not data:
                break
            got += data
        conn.sendall(b'{"pids": [1, 1]}\n{"codes": [0, 0], "first_failure": 0}\n')
    except OSError:
        pass
except TimeoutError:
    pass
print(json.dumps({"received": len(got), "env": b"MASTER_ADDR" in got}), flush=True)
"""

# Connects to the name in argv[1] and asks for a rank that would write argv[2].
INTRUDER = r"""
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect("\0" + sys.argv[1])
rank = {"env": {"RANK": "0"}, "log": sys.argv[2]}
req = {"module": "csfs_probe", "argv": ["ok"], "cwd": "/", "ranks": [rank]}
sock.settimeout(10)
try:
    sock.sendall(json.dumps(req).encode() + b"\n")
    reply = sock.recv(65536)
except OSError as err:
    reply = repr(err).encode()
print(json.dumps({"reply": reply.decode(errors="replace")}), flush=True)
"""


@pytest.fixture(scope="module")
def other_user() -> Iterator[str]:
    """A throwaway system user (no home), removed afterwards (with its group)."""
    name = f"csatk{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "-M", "-r", "-U", "-s", "/usr/sbin/nologin", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


def run_as(user: str, argv: list[str]) -> list[str]:
    """``argv`` as ``user``, exec'd in place (setpriv forks nothing: the pid Popen gets is the
    user's process itself, so killing it leaves nothing behind)."""
    pw = pwd.getpwnam(user)
    ids = [f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"]
    return ["setpriv", *ids, "--", *argv]


def _server_name(d: Path, preload: str = "csfs_probe") -> str:
    """The abstract name (without its NUL) a launch from ``d`` would connect to."""
    code = (
        "from commscope.node.forkserver import address, fingerprint; "
        f"print(address(fingerprint([{preload!r}]))[1:])"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=d, env=_env(d), capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip


def test_a_launch_sends_nothing_to_a_server_of_another_user(
    probe_dir: Path, other_user: str
) -> None:
    """Another user bound the name while no server held it: root's launch sent it the module,
    its cwd and every environment variable, and took its made-up exit codes for the ranks'."""
    squatter = subprocess.Popen(
        run_as(other_user, [SYSTEM_PYTHON, "-c", SQUATTER, _server_name(probe_dir)]),
        cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert squatter.stdout is not None
        assert squatter.stdout.readline().strip() == "listening", squatter.stderr
        res = _launch(probe_dir, "ok")
    finally:
        out, err = squatter.communicate(timeout=90)
    leaked = json.loads(out.splitlines()[-1])
    assert leaked == {"received": 0, "env": False}, f"the squatter got {leaked}"
    assert res.returncode == 1, res.stdout + res.stderr
    assert "held by pid" in res.stderr and f"({other_user})" in res.stderr, res.stderr
    assert "refusing to send it anything" in res.stderr, res.stderr
    assert not (probe_dir / "rank2.log").exists()


def test_a_server_serves_no_other_user(probe_dir: Path, other_user: str) -> None:
    res = _launch(probe_dir, "ok")  # a warm server of root's
    assert res.returncode == 0, res.stdout + res.stderr
    marker = Path("/tmp") / f"csfs-intruder-{uuid.uuid4().hex[:8]}.log"
    intruder = subprocess.run(
        run_as(other_user, [SYSTEM_PYTHON, "-c", INTRUDER, _server_name(probe_dir), str(marker)]),
        cwd="/", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert intruder.returncode == 0, intruder.stderr
    # Closed unanswered (an empty read, or a reset when the close came first).
    assert "pids" not in json.loads(intruder.stdout)["reply"], intruder.stdout
    time.sleep(0.2)  # a rank forked anyway would have opened its log by now
    assert not marker.exists()
    log = (probe_dir / "forkserver.log").read_text()
    assert "refused a connection from pid" in log and f"({other_user})" in log, log


# A launcher whose first connection reaches the warm server just before it exits: it connects,
# then `stop` ends that server (it takes no request while stopping), then the launch goes on.
STALE_FIRST = """
import os, subprocess, sys, time
import commscope.node.forkserver as fs

real, calls = fs._connect, []

def running(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

def stale_first(name):
    sock = real(name)
    if sock is not None and not calls:
        calls.append(name)
        stop = [sys.executable, "-m", fs.__name__, "stop", "--preload", "csfs_probe"]
        said = subprocess.run(stop, capture_output=True, text=True, check=True).stdout
        pid = int(said.split()[3])  # "asked fork server PID to exit"
        while running(pid):
            time.sleep(0.01)
        print(f"server {pid} gone after the connect", flush=True)
    return sock

fs._connect = stale_first
sys.exit(fs.main(sys.argv[1:]))
"""


def test_a_server_on_its_way_out_is_not_taken_for_ready(probe_dir: Path) -> None:
    """The launch that connected to a server about to exit (idle, or asked to stop) sent its
    request into a socket nobody would read: it failed (broken pipe, or no reply) instead of
    asking a fresh server."""
    warm = _launch(probe_dir, "ok")
    assert warm.returncode == 0, warm.stdout + warm.stderr
    args = _launch_args(probe_dir, "ok")
    res = subprocess.run(
        [sys.executable, "-c", STALE_FIRST, *args[3:]], cwd=probe_dir, env=_env(probe_dir),
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert "gone after the connect" in res.stdout, res.stdout + res.stderr
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ranks ended with exit codes [0, 0]" in res.stdout, res.stdout
    assert "asking a fresh one" in res.stdout, res.stdout
    # The first server's import, and the fresh one's.
    assert len((probe_dir / "imports.log").read_text().split()) == 2


def test_a_failed_start_reports_its_own_log_not_an_earlier_starts(probe_dir: Path) -> None:
    """The log is appended to by every start: a start whose server died without a word showed
    the previous start's last lines (its 'ready' line among them) as its own."""
    (probe_dir / "csfs_dead.py").write_text("import os\nos._exit(7)\n")
    log = probe_dir / "forkserver.log"
    log.write_text(
        "forkserver 4242 ready (csfs_dead)\nTraceback of an EARLIER START\nidle: exiting\n"
    )
    args = [
        sys.executable, "-m", "commscope.node.forkserver", "launch", "--preload", "csfs_dead",
        "--server-log", str(log), "--nproc", "1", "--node-rank", "0", "--nnodes", "1",
        "--master-addr", "127.0.0.1", "--master-port", "29999", "--module", "csfs_dead",
    ]  # fmt: skip
    res = subprocess.run(
        args, cwd=probe_dir, env=_env(probe_dir), capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "exited with code 7 while starting" in res.stderr, res.stderr
    assert "EARLIER START" not in res.stderr and "4242" not in res.stderr, res.stderr
    # The earlier lines stay in the log, where they were.
    assert log.read_text().startswith("forkserver 4242 ready")


# Holds the name in argv[1] without ever accepting: connections wait in its backlog.
HOLDER = r"""
import socket, sys, time
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind("\0" + sys.argv[1]); srv.listen(16)
print("listening", flush=True)
time.sleep(120)
"""


def test_stop_and_ensure_talk_to_no_other_user(probe_dir: Path, other_user: str) -> None:
    squatter = subprocess.Popen(
        run_as(other_user, [SYSTEM_PYTHON, "-c", HOLDER, _server_name(probe_dir)]),
        cwd="/", stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert squatter.stdout is not None
        assert squatter.stdout.readline().strip() == "listening"
        log = str(probe_dir / "forkserver.log")
        ensure = _forkserver(probe_dir, "ensure", "--preload", "csfs_probe", "--server-log", log)
        stop = _forkserver(probe_dir, "stop", "--preload", "csfs_probe")
    finally:
        squatter.kill()
        squatter.wait()
    for res in (ensure, stop):
        assert res.returncode == 1 and "held by pid" in res.stderr, res.stdout + res.stderr
