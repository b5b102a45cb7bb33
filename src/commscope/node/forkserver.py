"""Warm rank launcher: a per-node fork server that has already imported torch and the workload.

Starting a rank from scratch costs a fresh interpreter, torch's import and the workload's own
(~2.5 s each on a 2-core node), and torchrun adds its agent's import, its own start-up and its
shutdown (~7 s of a 16 s cell, benchmarks/cell.py). The fork server pays the imports once per
node: it imports the workload module (and calls its ``preload()``, which imports what model
building would import lazily), then forks one fresh child per rank for every cell. Each child
gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...), its own session,
its own log, and runs the module as ``python -m`` would, so the process group, the model and
the seeds are as fresh as under torchrun; nothing of a cell survives in the server.

Two commands (``python -m commscope.node.forkserver ...``):

- ``launch``: what the orchestrator runs on each node, under ``timeout``, with the cell's tag
  on its command line. It connects to the server (starting it if none runs), asks for this
  node's ranks, waits for them and exits with the first failing rank's code. If it dies (the
  cell's kill by tag, the timeout), the server sees the connection close and kills the ranks.
  The server also kills a node's remaining ranks as soon as one fails, as torchrun does.
- ``ensure``: start the server if none runs, without waiting (the cell's prepare step, so the
  imports overlap shaping and probe start).
- ``stop``: ask the server to exit (it does when no ranks run).

Both ends check who is at the other (SO_PEERCRED): the server serves only its own user, and a
client talks only to a server of its own user. An abstract name is open to every local user, and
nothing stops another user from binding it while no server holds it; such a "server" must get
neither the module, the working directory and the environment a launch sends, nor a say in the
exit code (:class:`ForeignServer`).

One server per node, user and code version: its name (an abstract Unix socket, private to the
node's network namespace) carries the user's uid and a fingerprint of the interpreter, of
commscope's and torch's files and of the thread-count variables read at import, so edited code
gets a fresh server.

A start sees only itself: what a failed start reports from the (shared, appended) log is what
was written after it began, and a client that reached a server on its way out (idle, or asked
to stop) before it took the request asks a fresh one.
A server exits after ``IDLE_EXIT_S`` without a request. This module imports only the standard
library above the ``serve`` command, so ``launch`` starts in tens of milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IDLE_EXIT_S = 600.0
START_TIMEOUT_S = 180.0
KILL_GRACE_S = 2.0
# How often a launch asks again when a server closes the connection before taking the request
# (it was exiting), and how many servers one connect may start (one that lost the start race to
# a server that has gone since starts another).
REQUEST_TRIES = 3
MAX_SPAWNS = 5
# Read by the OpenMP/MKL runtimes when torch is imported: a server imported with other values
# would give its ranks other thread pools, so they are part of its identity.
# COMMSCOPE_CAPTURE: which capture kernel the preload installs (commscope.workload.capture_native).
IMPORT_TIME_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "PYTHONPATH",
    "CUDA_VISIBLE_DEVICES",
    "COMMSCOPE_CAPTURE",
)


class LaunchError(RuntimeError):
    """The fork server could not be reached or started."""


class ForeignServer(LaunchError):
    """The server's name is held by a process of another user: nothing is sent to it."""


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected Unix socket, as the
    kernel recorded them when it connected (client) or listened (server): SO_PEERCRED."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid


def _user(uid: int) -> str:
    """``uid N (name)`` for messages."""
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def fingerprint(preload: Sequence[str]) -> str:
    """The identity of a server able to run ``preload`` with this interpreter and code."""
    h = hashlib.sha256()
    h.update(f"{sys.executable}\0{sys.version}\0{','.join(preload)}".encode())
    for var in IMPORT_TIME_ENV:
        h.update(f"\0{var}={os.environ.get(var, '')}".encode())
    roots = []
    for pkg in ("commscope", "torch"):
        spec = importlib.util.find_spec(pkg)
        if spec and spec.origin:
            roots.append(Path(spec.origin).parent)
    pkg_root = roots[0] if roots else None
    sources = [*pkg_root.rglob("*.py"), *pkg_root.rglob("*.cpp")] if pkg_root else []
    # The native extensions built into this environment (the capture's kernel): a server
    # started before a build must not keep running the Python kernels.
    sources += Path(sys.prefix, "share", "commscope").glob("*.so")
    for path in sorted(sources):
        st = path.stat()
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    for root in roots[1:]:  # torch: its version file says enough
        st = (root / "version.py").stat()
        h.update(f"{root}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def address(fp: str) -> str:
    """The server's abstract socket name (no file: it vanishes with the server or namespace).
    Each user's servers have their own names, so two users' launches never meet."""
    return f"\0commscope-forkserver-{os.geteuid()}-{fp}"


# ────────────────────────────────────────────────────────────────────────────── server


@dataclass
class _Request:
    """One ``launch`` connection: its ranks' pids (None once reaped) and exit codes."""

    conn: socket.socket
    pids: list[int | None] = field(default_factory=list)
    codes: list[int | None] = field(default_factory=list)
    kill_at: float | None = None  # when still-running ranks get SIGKILL
    first_failure: int = 0  # the exit code of the first rank that failed (the cause)

    def live(self) -> list[int]:
        return [p for p in self.pids if p is not None]


def _exit_code(status: int) -> int:
    """A shell's view of a child's end: its exit code, or 128 + the signal that killed it."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _run_child(module: str, argv: list[str], cwd: str, env: dict[str, str], log: str) -> None:
    """In the forked child: become the rank and run ``module`` as ``python -m`` would."""
    import runpy
    import traceback
    import warnings

    code = 1
    try:
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.chdir(cwd)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [module, *argv]
        # runpy warns that the module is imported already: it is, by the preload, on purpose;
        # run_module still executes a fresh copy as __main__, as `python -m` would.
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="runpy")
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            # No interpreter teardown: the server's atexit handlers and torch's are not the
            # rank's, and skipping them saves the exit's second.
            os._exit(code)


def _start_ranks(req: _Request, msg: dict[str, Any]) -> None:
    for rank in msg["ranks"]:
        pid = os.fork()
        if pid == 0:
            req.conn.close()
            _run_child(msg["module"], msg["argv"], msg["cwd"], rank["env"], rank["log"])
        req.pids.append(pid)
        req.codes.append(None)


def _same_user(conn: socket.socket) -> bool:
    """Whether the peer runs as this server's user (SO_PEERCRED): only it may fork ranks."""
    pid, uid, _gid = peer_credentials(conn)
    if uid != os.geteuid():
        print(f"refused a connection from pid {pid} of {_user(uid)}", flush=True)
        return False
    return True


def _signal(req: _Request, sig: int) -> None:
    for pid in req.live():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)


NAME_TAKEN = 3  # serve's exit code when another server holds the name (it won a start race)


def serve(name: str, preload: Sequence[str]) -> int:
    """Import ``preload`` (calling each module's ``preload()`` if it has one), then fork ranks
    for ``launch`` requests until idle for ``IDLE_EXIT_S``. Single-threaded on purpose: a
    fork from a process with other threads could copy a lock one of them holds. Returns the
    exit code (``NAME_TAKEN`` when another server holds ``name``)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(name)
    except OSError:
        print("another server holds this name: exiting", flush=True)
        return NAME_TAKEN
    # Listen before the imports: clients connect at once and their requests wait in the
    # backlog until the server is ready, instead of being refused meanwhile.
    listener.listen(64)
    for mod in preload:
        loaded = importlib.import_module(mod)
        if hasattr(loaded, "preload"):
            loaded.preload()
    print(f"forkserver {os.getpid()} ready ({', '.join(preload)})", flush=True)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    requests: dict[socket.socket, _Request] = {}
    buffers: dict[socket.socket, bytes] = {}
    last_active = time.monotonic()
    while True:
        for key, _ in sel.select(timeout=0.02):
            sock = key.fileobj
            if sock is listener:
                conn, _ = listener.accept()
                if not _same_user(conn):  # an abstract socket is open to every local user
                    conn.close()
                    continue
                sel.register(conn, selectors.EVENT_READ)
                buffers[conn] = b""
                continue
            assert isinstance(sock, socket.socket)
            data = sock.recv(65536)
            if data and sock not in requests:
                buffers[sock] += data
                if b"\n" not in buffers[sock]:
                    continue
                try:
                    msg = json.loads(buffers[sock].split(b"\n", 1)[0])
                    if not isinstance(msg, dict):
                        raise ValueError("not an object")
                except ValueError as err:  # one client's garbage must not end the server
                    print(f"dropped a malformed request: {err}", flush=True)
                    sel.unregister(sock)
                    sock.close()
                    buffers.pop(sock, None)
                    continue
                if msg.get("op") in ("ping", "exit"):
                    sock.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
                    if msg["op"] == "exit" and not requests:
                        print("asked to exit: exiting", flush=True)
                        return 0
                    continue
                req = requests[sock] = _Request(sock)
                _start_ranks(req, msg)
                # A client gone already is seen by the next recv, which ends the ranks.
                with contextlib.suppress(OSError):
                    sock.sendall(json.dumps({"pids": req.pids}).encode() + b"\n")
            elif not data:  # the client is gone: its ranks go too
                req = requests.get(sock)
                if req is None or not req.live():
                    sel.unregister(sock)
                    sock.close()
                    requests.pop(sock, None)
                    buffers.pop(sock, None)
                elif req.kill_at is None:
                    _signal(req, signal.SIGTERM)
                    req.kill_at = time.monotonic() + KILL_GRACE_S
        now = time.monotonic()
        for sock, req in list(requests.items()):
            for i, pid in enumerate(req.pids):
                if pid is None:
                    continue
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    req.pids[i], req.codes[i] = None, _exit_code(status)
                    if req.codes[i] and not req.first_failure:
                        req.first_failure = req.codes[i] or 0
                    if req.codes[i] and req.kill_at is None:  # one rank failed: end the others
                        _signal(req, signal.SIGTERM)
                        req.kill_at = now + KILL_GRACE_S
            if req.live() and req.kill_at is not None and now > req.kill_at:
                _signal(req, signal.SIGKILL)
            if not req.live():
                with contextlib.suppress(OSError):
                    reply = {"codes": req.codes, "first_failure": req.first_failure}
                    sock.sendall(json.dumps(reply).encode() + b"\n")
                sel.unregister(sock)
                sock.close()
                del requests[sock]
                buffers.pop(sock, None)
        if requests or buffers:
            last_active = now
        elif now - last_active > IDLE_EXIT_S:
            print("idle: exiting", flush=True)
            return 0


# ────────────────────────────────────────────────────────────────────────────── client


def _connect(name: str) -> socket.socket | None:
    """A connection to the server at ``name``, None when none listens there. Raises
    :class:`ForeignServer` (sending nothing) when another user's process holds the name."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(name)
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    pid, uid, _gid = peer_credentials(sock)
    if uid != os.geteuid():
        sock.close()
        raise ForeignServer(
            f"the fork server's name {name[1:]!r} is held by pid {pid} of {_user(uid)}, not "
            f"by this user ({_user(os.geteuid())}): refusing to send it anything (another user "
            "bound the name while no server of ours held it; end that process, or run as that "
            "user)"
        )
    return sock


@dataclass
class _Start:
    """A server this client started: its process, and where its lines begin in the log (the
    log is appended to by every start: what came before is an earlier start's)."""

    process: subprocess.Popen[bytes]
    log: Path
    offset: int

    def lines(self, last: int = 15) -> str:
        """The last ``last`` lines this start wrote to the log (only this start's)."""
        with open(self.log, "rb") as fh:
            fh.seek(self.offset)
            text = fh.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-last:]) or "(nothing)"

    def failure(self) -> str:
        return (
            f"the fork server (pid {self.process.pid}) exited with code "
            f"{self.process.returncode} while starting; what it logged ({self.log}):\n"
            f"{self.lines()}"
        )


def _spawn_server(fp: str, preload: Sequence[str], log: Path) -> _Start:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        out.write(f"--- {stamp} fork server started by pid {os.getpid()}\n".encode())
        out.flush()
        offset = out.tell()  # appended: the end, wherever an earlier start left it
        process = subprocess.Popen(
            [sys.executable, "-m", __spec__.name if __spec__ else "commscope.node.forkserver",
             "serve", "--fingerprint", fp, "--preload", ",".join(preload)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            close_fds=True,
        )  # fmt: skip
    return _Start(process, log, offset)


def connect(
    preload: Sequence[str], log: Path, timeout_s: float = START_TIMEOUT_S
) -> tuple[socket.socket, _Start | None]:
    """A connection to this node's server for ``preload``, starting one if none runs; and the
    start, when this call made one."""
    fp = fingerprint(preload)
    name = address(fp)
    sock = _connect(name)
    if sock is not None:
        return sock, None
    start = _spawn_server(fp, preload, log)
    spawned = 1
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.05)
        # Polled before connecting: a server that lost the start race (NAME_TAKEN) leaves
        # the name to the one that won, which answers on a later try.
        code = start.process.poll()
        sock = _connect(name)
        if sock is not None:
            return sock, start
        if code == NAME_TAKEN and spawned < MAX_SPAWNS:
            # The winner is gone already (it exited, or failed): nobody holds the name.
            start = _spawn_server(fp, preload, log)
            spawned += 1
        elif code is not None and code != NAME_TAKEN:
            raise LaunchError(start.failure())
    raise LaunchError(f"no fork server answered within {timeout_s:.0f} s (its log: {log})")


def _request(
    preload: Sequence[str], log: Path, msg: dict[str, Any]
) -> tuple[socket.socket, Any, dict[str, Any]]:
    """Send ``msg`` to this node's server; (the connection, its line reader, the server's
    first reply: the ranks' pids). A server that closes the connection before it took the
    request was on its way out (idle, or asked to stop): a fresh one is asked. A server this
    call started that ended meanwhile is a failed start."""
    for _ in range(REQUEST_TRIES):
        sock, start = connect(preload, log)
        try:
            sock.sendall(json.dumps(msg).encode() + b"\n")
            lines = sock.makefile("r")
            first = lines.readline()
        except (BrokenPipeError, ConnectionResetError):
            first = ""
        if first:
            return sock, lines, json.loads(first)
        sock.close()
        if start is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                start.process.wait(timeout=KILL_GRACE_S)
            if start.process.returncode not in (None, 0, NAME_TAKEN):
                raise LaunchError(start.failure())
        print("the fork server closed the connection before starting the ranks (it was "
              "exiting): asking a fresh one", flush=True)  # fmt: skip
    raise LaunchError(
        f"the fork server closed the connection before starting the ranks {REQUEST_TRIES} "
        f"times (its log: {log})"
    )


def rank_env(
    base: dict[str, str], *, rank: int, local_rank: int, nproc: int, node_rank: int, nnodes: int,
    master_addr: str, master_port: int,
) -> dict[str, str]:  # fmt: skip
    """The environment torchrun gives a worker (static rendezvous, no restarts): what
    ``init_process_group("env://")`` and the entry points read."""
    world = nproc * nnodes
    return {
        **base,
        "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(node_rank),
        "GROUP_WORLD_SIZE": str(nnodes), "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "default", "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
    }  # fmt: skip


def launch(args: argparse.Namespace) -> int:
    """Run this node's ranks in the server; the exit code of the rank that failed first (0
    when none did; the others may have been ended by the server because of it)."""
    preload = args.preload.split(",")
    cwd = os.getcwd()
    ranks = []
    for local in range(args.nproc):
        rank = args.node_rank * args.nproc + local
        env = rank_env(
            dict(os.environ), rank=rank, local_rank=local, nproc=args.nproc,
            node_rank=args.node_rank, nnodes=args.nnodes, master_addr=args.master_addr,
            master_port=args.master_port,
        )  # fmt: skip
        ranks.append({"env": env, "log": os.path.join(cwd, f"rank{rank}.log")})
    msg = {"module": args.module, "argv": args.argv, "cwd": cwd, "ranks": ranks}
    sock, lines, started = _request(preload, Path(args.server_log), msg)

    def gone(signum: int, _frame: object) -> None:
        sock.close()  # the server kills the ranks when it sees the connection close
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, gone)
    numbers = [r["env"]["RANK"] for r in ranks]
    print(f"ranks {numbers} started as pids {started['pids']}", flush=True)
    reply = lines.readline()
    if not reply:
        print("the fork server closed the connection before the ranks ended", flush=True)
        return 1
    ended = json.loads(reply)
    print(f"ranks ended with exit codes {ended['codes']}", flush=True)
    return int(ended["first_failure"])


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``serve``, ``ensure`` or ``launch`` (see the module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    srv = sub.add_parser("serve", help="run a server (started by ensure/launch)")
    srv.add_argument("--fingerprint", required=True)
    srv.add_argument("--preload", required=True)
    for name in ("ensure", "launch", "stop"):
        p = sub.add_parser(name)
        p.add_argument("--preload", required=True, help="modules to import, comma-separated")
        if name != "stop":
            p.add_argument("--server-log", required=True, help="its log (outlives cells)")
    lp = sub.choices["launch"]
    lp.add_argument("--nproc", type=int, required=True)
    lp.add_argument("--node-rank", type=int, required=True)
    lp.add_argument("--nnodes", type=int, required=True)
    lp.add_argument("--master-addr", required=True)
    lp.add_argument("--master-port", type=int, required=True)
    lp.add_argument("--module", required=True)
    lp.add_argument("argv", nargs=argparse.REMAINDER, help="the module's arguments (after --)")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except LaunchError as err:
        print(f"fork server {args.cmd}: {err}", file=sys.stderr, flush=True)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.cmd == "serve":
        return serve(address(args.fingerprint), args.preload.split(","))
    if args.cmd == "stop":
        sock = _connect(address(fingerprint(args.preload.split(","))))
        if sock is None:
            return 0
        with sock:
            sock.sendall(b'{"op": "exit"}\n')
            reply = sock.makefile("r").readline()
        pid = json.loads(reply)["pid"] if reply else "(it was exiting already)"
        print(f"asked fork server {pid} to exit")
        return 0
    if args.cmd == "ensure":
        preload = args.preload.split(",")
        fp = fingerprint(preload)
        sock = _connect(address(fp))
        if sock is None:
            _spawn_server(fp, preload, Path(args.server_log))
        else:
            sock.close()
        return 0
    if args.argv and args.argv[0] == "--":
        args.argv = args.argv[1:]
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
