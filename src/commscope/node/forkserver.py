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

Only processes of the server's own user may connect (SO_PEERCRED).

One server per node and code version: its name (an abstract Unix socket, private to the
node's network namespace) carries a fingerprint of the interpreter, of commscope's and torch's
files and of the thread-count variables read at import, so edited code gets a fresh server.
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
# Read by the OpenMP/MKL runtimes when torch is imported: a server imported with other values
# would give its ranks other thread pools, so they are part of its identity.
IMPORT_TIME_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONPATH", "CUDA_VISIBLE_DEVICES")


class LaunchError(RuntimeError):
    """The fork server could not be reached or started."""


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
    for path in sorted(pkg_root.rglob("*.py")) if pkg_root else ():
        st = path.stat()
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    for root in roots[1:]:  # torch: its version file says enough
        st = (root / "version.py").stat()
        h.update(f"{root}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def address(fp: str) -> str:
    """The server's abstract socket name (no file: it vanishes with the server or namespace)."""
    return f"\0commscope-forkserver-{fp}"


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
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()


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
                msg = json.loads(buffers[sock].split(b"\n", 1)[0])
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
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(name)
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    return sock


def _spawn_server(fp: str, preload: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", __spec__.name if __spec__ else "commscope.node.forkserver",
             "serve", "--fingerprint", fp, "--preload", ",".join(preload)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            close_fds=True,
        )  # fmt: skip


def connect(preload: Sequence[str], log: Path, timeout_s: float = START_TIMEOUT_S) -> socket.socket:
    """A connection to this node's server for ``preload``, starting one if none runs."""
    fp = fingerprint(preload)
    name = address(fp)
    sock = _connect(name)
    if sock is not None:
        return sock
    server = _spawn_server(fp, preload, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.05)
        # Polled before connecting: a server that lost the start race (NAME_TAKEN) leaves
        # the name to the one that won, which answers on a later try.
        ended = server.poll() not in (None, NAME_TAKEN)
        sock = _connect(name)
        if sock is not None:
            return sock
        if ended:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise LaunchError(f"the fork server exited while starting; its log ({log}):\n{tail}")
    raise LaunchError(f"no fork server answered within {timeout_s:.0f} s (its log: {log})")


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
    sock = connect(preload, Path(args.server_log))

    def gone(signum: int, _frame: object) -> None:
        sock.close()  # the server kills the ranks when it sees the connection close
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, gone)
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
    sock.sendall(json.dumps(msg).encode() + b"\n")
    lines = sock.makefile("r")
    started = json.loads(lines.readline())
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
    if args.cmd == "serve":
        return serve(address(args.fingerprint), args.preload.split(","))
    if args.cmd == "stop":
        sock = _connect(address(fingerprint(args.preload.split(","))))
        if sock is None:
            return 0
        with sock:
            sock.sendall(b'{"op": "exit"}\n')
            print(f"asked fork server {json.loads(sock.makefile('r').readline())['pid']} to exit")
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
