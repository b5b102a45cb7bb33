"""Nodes reached over SSH: one interface for the netns backend and for real hosts.

Every action on a node (commands, file transfer) goes through :class:`Host`, a thin wrapper
around a fabric ``Connection`` that *verifies host keys*: fabric sets paramiko's AutoAddPolicy and
loads no known_hosts file (fabric #2071, #1804), so we load the cluster's known_hosts ourselves
and reject unknown keys.
"""

from __future__ import annotations

import contextlib
import json
import re
import select
import shlex
import tarfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import paramiko
from fabric import Connection
from invoke.exceptions import UnexpectedExit
from invoke.runners import Result

# A remote command that has not ended after this long is a hung node (or a vanished one: an SSH
# channel to a deleted namespace's sshd waits forever). Every command has this backstop unless
# its caller passes its own timeout (the ranks' run: run.timeout_s) or None on purpose; no
# control command (shaping, probes, building a tool, fetching) comes near it.
COMMAND_TIMEOUT_S = 300.0
# What `export NAME=value` accepts as NAME (POSIX shell names).
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class NodeSpec:
    """How to reach one node and what it has.

    ``ssh_host`` is the management (control) address: SSH only, never shaped.
    ``exp_iface``/``exp_addr`` are the experiment network: training traffic, tc shaping,
    counter sampling.
    """

    name: str
    index: int
    ssh_host: str
    exp_iface: str
    exp_addr: str
    ssh_port: int = 22
    user: str = "root"
    key_file: str = ""
    known_hosts: str = ""
    workdir: str = "/tmp/commscope"
    python: str = "python3"
    # Name of the IFB device that carries this node's ingress shaping (created on demand).
    ifb_iface: str = "ifb0"
    # netns backend only: the namespace the node lives in (root tools use it for cleanup).
    netns: str | None = None
    # The experiment interface's MTU and whether it hands the stack's super-packets on whole
    # (TSO/GSO, or GRO on receive, on): tbf buckets are sized for its largest packet. The netns
    # backend sets both; for real hosts provisioning reads them off the NIC (link_facts).
    # Unknown means offloads on: the 64 KB bucket passes any packet.
    mtu: int = 1500
    offload: bool = True


@dataclass
class Cluster:
    """A set of nodes plus where its state lives; serialisable to JSON."""

    name: str
    backend: str
    nodes: list[NodeSpec]
    state_dir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.nodes)

    def to_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "name": self.name,
            "backend": self.backend,
            "state_dir": self.state_dir,
            "extra": self.extra,
            "nodes": [asdict(n) for n in self.nodes],
        }
        path.write_text(json.dumps(payload, indent=2))

    @classmethod
    def from_json(cls, path: Path) -> Cluster:
        payload = json.loads(Path(path).read_text())
        return cls(
            name=payload["name"],
            backend=payload["backend"],
            state_dir=payload.get("state_dir", ""),
            extra=payload.get("extra", {}),
            nodes=[NodeSpec(**n) for n in payload["nodes"]],
        )

    def hosts(self, connect_timeout: float = 10.0) -> list[Host]:
        return [Host(n, connect_timeout=connect_timeout) for n in self.nodes]


class _Shell:
    """One long-lived ``/bin/sh`` on an SSH channel that runs commands one after another.

    A fresh SSH command costs a session set-up in sshd and a start of the user's login shell,
    which sources ~/.bashrc when sshd starts it (Debian's bash): 150 ms per command on this
    machine's root, whose .bashrc initialises pyenv. Through this shell a command costs what it
    runs. Each command runs in a subshell (its ``exit``, ``cd`` and exports stay there) with
    stdin from /dev/null; a marker line with its exit status ends its output on both streams.
    """

    def __init__(self, conn: Connection) -> None:
        conn.open()
        self.channel = conn.client.get_transport().open_session()
        # bash -c 'exec /bin/sh': the login shell's start-up runs once, here.
        self.channel.exec_command("exec /bin/sh")
        self.lock = threading.Lock()
        self.run("true", 60.0)  # whatever the login shell's start-up printed goes with it

    def run(self, cmd: str, timeout: float | None) -> tuple[str, str, int]:
        mark = f"@@commscope-end-{uuid.uuid4().hex}"
        script = (
            f"( {cmd}\n) < /dev/null; rc=$?; printf '\\n%s %s\\n' {mark} $rc; "
            f"printf '\\n%s\\n' {mark} >&2\n"
        )
        self.channel.sendall(script.encode())
        out, err = bytearray(), bytearray()
        end_out, end_err = f"\n{mark} ".encode(), f"\n{mark}\n".encode()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (self._ended(out, end_out) and err.endswith(end_err)):
            if self.channel.exit_status_ready() and not (
                self.channel.recv_ready() or self.channel.recv_stderr_ready()
            ):
                raise OSError("the node's shell ended")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"command did not end within {timeout} s: {cmd[:200]}")
            select.select([self.channel], [], [], left)
            while self.channel.recv_ready():
                out += self.channel.recv(1 << 16)
            while self.channel.recv_stderr_ready():
                err += self.channel.recv_stderr(1 << 16)
        body, _, tail = bytes(out).rpartition(end_out)
        code = int(tail.split()[0])
        return body.decode(errors="replace"), err[: -len(end_err)].decode(errors="replace"), code

    @staticmethod
    def _ended(out: bytearray, end: bytes) -> bool:
        """Whether ``out`` holds the whole end line (marker, status, newline)."""
        at = out.rfind(end)
        return at >= 0 and out.endswith(b"\n") and len(out) > at + len(end)

    def close(self) -> None:
        self.channel.close()


class Host:
    """One node over SSH with verified host keys. Use as a context manager or call close()."""

    def __init__(self, spec: NodeSpec, connect_timeout: float = 10.0) -> None:
        self.spec = spec
        connect_kwargs: dict[str, Any] = {
            "look_for_keys": False,
            "allow_agent": False,
            "banner_timeout": connect_timeout,
            "auth_timeout": connect_timeout,
        }
        if spec.key_file:
            connect_kwargs["key_filename"] = spec.key_file
        self.conn = Connection(
            host=spec.ssh_host,
            user=spec.user,
            port=spec.ssh_port,
            connect_timeout=connect_timeout,
            connect_kwargs=connect_kwargs,
        )
        client: paramiko.SSHClient = self.conn.client
        if spec.known_hosts:
            client.load_host_keys(spec.known_hosts)
        # Reject anything not in known_hosts: a wrong key is an error, never silently trusted.
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        self._shell: _Shell | None = None
        self._shell_lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.spec.name

    def run(
        self,
        cmd: str,
        *,
        timeout: float | None = COMMAND_TIMEOUT_S,
        warn: bool = False,
        env: dict[str, str] | None = None,
        hide: bool | str = True,
    ) -> Result:
        """Run a shell command on the node. ``env`` is exported inline (sshd drops SendEnv).

        Commands go through the node's long-lived shell (:class:`_Shell`) when it is free; one
        issued while another runs (a kill from another thread) gets an SSH command of its own.
        ``timeout`` (default :data:`COMMAND_TIMEOUT_S`; None: none) raises TimeoutError (and
        drops the shell) when the command runs longer: a hung node fails its cell instead of
        blocking it forever."""
        if env:
            # Values are quoted; a name cannot be, so it must be a plain shell name.
            bad = [k for k in env if not _ENV_NAME.fullmatch(k)]
            if bad:
                raise ValueError(f"not an environment variable name: {bad[0]!r}")
            exports = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items())
            cmd = f"export {exports}; {cmd}"
        shell = self._free_shell()
        if shell is None:
            return self.conn.run(cmd, timeout=timeout, warn=warn, hide=hide, in_stream=False)
        try:
            stdout, stderr, code = shell.run(cmd, timeout)
        except Exception:
            self._drop_shell(shell)  # its state is unknown now: the next command starts anew
            raise
        finally:
            shell.lock.release()  # held since _free_shell handed it over
        result = Result(stdout=stdout, stderr=stderr, command=cmd, exited=code, hide=("both",))
        if code != 0 and not warn:
            raise UnexpectedExit(result)
        return result

    def _free_shell(self) -> _Shell | None:
        """The node's shell, locked for the caller; None when another command holds it."""
        with self._shell_lock:
            if self._shell is None:
                self._shell = _Shell(self.conn)
            shell = self._shell
        return shell if shell.lock.acquire(blocking=False) else None

    def _drop_shell(self, shell: _Shell) -> None:
        with self._shell_lock:
            if self._shell is shell:
                self._shell = None
        shell.close()

    def put(self, local: str | Path, remote: str) -> None:
        self.conn.put(str(local), remote)

    def get(self, remote: str, local: str | Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        self.conn.get(remote, str(local))

    def fetch_tree(self, remote: str, local: str | Path, remove: bool = True) -> None:
        """Copy the files of directory ``remote`` into ``local`` as one tar stream over one SSH
        command (per-file SFTP costs round trips per file), then, with ``remove``, delete
        ``remote``. A missing ``remote`` copies nothing."""
        Path(local).mkdir(parents=True, exist_ok=True)
        d = shlex.quote(remote)
        rm = f"rm -rf {d}; " if remove else ""
        self.conn.open()
        _, stdout, stderr = self.conn.client.exec_command(
            f"test -d {d} || exit 2; tar -C {d} -cf - .; rc=$?; {rm}exit $rc"
        )
        try:
            with tarfile.open(fileobj=stdout, mode="r|") as tar:
                tar.extractall(local, filter="data")
        except tarfile.ReadError:
            if stdout.channel.recv_exit_status() != 2:  # 2: no such directory, nothing to copy
                raise
        code = stdout.channel.recv_exit_status()
        if code not in (0, 2):
            raise RuntimeError(f"{self.name}: fetching {remote} failed: {stderr.read().decode()}")

    def close(self) -> None:
        with self._shell_lock:
            if self._shell is not None:
                self._shell.close()
                self._shell = None
        self.conn.close()

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


T = TypeVar("T")


def on_all(hosts: list[Host], fn: Callable[[Host], T]) -> list[T]:
    """Run ``fn`` on every host concurrently (one thread each), results in host order.

    Each SSH round trip costs ~0.1-0.2 s, so per-node steps done one node after another add
    seconds per cell. Every host's call runs to the end even if another fails; then the first
    failure (in host order) is raised, so cleanup steps never skip a node. The exception
    carries the host's name as ``node`` (set once: the innermost host that failed), so a
    caller can say which node an SSH error came from.
    """
    if len(hosts) <= 1:
        return [_on(h, fn) for h in hosts]
    with ThreadPoolExecutor(len(hosts)) as pool:
        futures = [pool.submit(_on, h, fn) for h in hosts]
        wait(futures)
    for fut in futures:
        if fut.exception() is not None:
            raise fut.exception()
    return [fut.result() for fut in futures]


def _on(host: Host, fn: Callable[[Host], T]) -> T:
    try:
        return fn(host)
    except Exception as err:
        if getattr(err, "node", None) is None:
            with contextlib.suppress(AttributeError):  # an exception without a __dict__
                err.node = host.name  # type: ignore[attr-defined]
        raise
