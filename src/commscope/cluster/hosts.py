"""Nodes reached over SSH: one interface for the netns backend and for real hosts.

Every action on a node (commands, file transfer) goes through :class:`Host`, a thin wrapper
around a fabric ``Connection`` that *verifies host keys*: fabric sets paramiko's AutoAddPolicy and
loads no known_hosts file (fabric #2071, #1804), so we load the cluster's known_hosts ourselves
and reject unknown keys.

Everything commscope writes on a node lives below the node's ``workdir`` (run directories, the
fork server's log, the BPF object cache), and root writes and loads it there. So before its
first command a Host makes sure nobody else can plant a file in it: it creates a missing
workdir with mode 0700 and refuses (:class:`WorkdirError`) one owned by another user, writable
by group or others, a symbolic link, or below a directory another user could swap it in
(:func:`workdir_script`). The default ``/tmp/commscope`` is a guessable name in a directory
everyone writes: a workdir another user created first is refused, never used.
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
# The line :func:`workdir_script` prints, then what is wrong, when it refuses the workdir.
_WORKDIR_MARK = "@@commscope-workdir"


class WorkdirError(RuntimeError):
    """A node's workdir is not private to the SSH user (another user owns it or could write
    or swap files in it): nothing was run there. The message names the node, the path, what is
    wrong and the fix (the inventory's ``workdir``)."""


def workdir_script(workdir: str) -> str:
    """Shell lines that create ``workdir`` (mode 0700) unless it exists, then check it: a
    directory (not a symbolic link) owned by the connecting user and writable by nobody else;
    every directory above it, as written and as resolved, owned by root or that user and not
    writable by others unless sticky (/tmp): else nobody but root and the user can rename or
    replace it. Each check is one ``stat`` of the path itself (``lstat``: a symbolic link is
    seen, never followed). Exit 0, or print ``@@commscope-workdir REASON...`` and exit 1."""
    d = shlex.quote(workdir)
    bad = f'{{ echo {_WORKDIR_MARK} "$@"; exit 1; }}'
    # Few processes (a new shell runs this, once per connection): the directories above come
    # from parameter expansion and are stat'ed in one call, their type read off the raw mode.
    return (
        f"cs_bad() {bad}; me=$(id -u); d={d}; "
        'mkdir -m 700 -p -- "$d" 2>/dev/null; '
        'set -- $(stat -c "%u %a %F" -- "$d" 2>/dev/null); '
        '[ "$3" = directory ] || { [ -L "$d" ] && cs_bad symlink; '
        '[ -e "$d" ] && cs_bad notdir; cs_bad missing; }; '
        '[ "$1" = "$me" ] || cs_bad owner "$1" "$me"; '
        '[ $(( 0$2 & 022 )) -eq 0 ] || cs_bad mode "$2"; '
        'real=$(cd -P -- "$d" && pwd -P) || cs_bad missing; '
        'set --; for p in "$d" "$real"; do p=${p%/*}; '
        'while [ "${p#/}" != "$p" ]; do set -- "$@" "$p"; p=${p%/*}; done; done; '
        'stat -c "%u %a %f %n" -- / "$@" | { while read -r uid mode raw name; do '
        '[ "$uid" = 0 ] || [ "$uid" = "$me" ] || cs_bad parent owner "$uid" "$me" "$name"; '
        "[ $(( 0x$raw & 0xF000 )) -eq $(( 0xA000 )) ] || [ $(( 0$mode & 022 )) -eq 0 ] || "
        '[ $(( 0$mode & 01000 )) -ne 0 ] || cs_bad parent mode "$mode" "$name"; '
        "done; } || exit 1"
    )


def workdir_problem(spec: NodeSpec, words: list[str]) -> str:
    """The message of :class:`WorkdirError` for ``words``, what :func:`workdir_script` printed
    after its mark (pure)."""
    where = f"node {spec.name} ({spec.ssh_host}): workdir {spec.workdir}"
    what, rest = (words[0], words[1:]) if words else ("", [])
    if what == "owner":
        why = f"is owned by uid {rest[0]}, not by {spec.user} (uid {rest[1]}) who connects"
    elif what == "mode":
        why = f"is writable by group or others (mode {rest[0]})"
    elif what == "symlink":
        why = "is a symbolic link"
    elif what == "notdir":
        why = "is not a directory"
    elif what == "missing":
        why = "cannot be created (or entered)"
    elif what == "parent" and len(rest) >= 4 and rest[0] == "owner":
        parent = " ".join(rest[3:])
        why = f"is in {parent}, owned by uid {rest[1]} (neither root nor {spec.user})"
    elif what == "parent" and len(rest) >= 3 and rest[0] == "mode":
        parent = " ".join(rest[2:])
        why = f"is in {parent}, writable by group or others and not sticky (mode {rest[1]})"
    else:
        why = f"failed its check ({' '.join(words)})"
    return (
        f"{where} {why}: another user could plant files there (a symbolic link as a log, a "
        "BPF object) that commscope writes through or loads as root, so nothing runs there. "
        f"Remove {spec.workdir} on the node if you did not make it, or set workdir in the "
        "inventory (for the node or at the top) to a directory only the SSH user can write, "
        f"e.g. /root/commscope or /var/lib/commscope (a missing one is created with mode 0700)"
    )


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

    def __init__(self, conn: Connection, setup: str = "true") -> None:
        conn.open()
        self.channel = conn.client.get_transport().open_session()
        # bash -c 'exec /bin/sh': the login shell's start-up runs once, here.
        self.channel.exec_command("exec /bin/sh")
        self.lock = threading.Lock()
        # Whatever the login shell's start-up printed goes with the first command's output.
        self.setup = self.run(setup, 60.0)

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
        """The node's shell, locked for the caller; None when another command holds it. A new
        shell first checks the workdir (:func:`workdir_script`): WorkdirError when it is not
        private, and nothing else runs."""
        with self._shell_lock:
            if self._shell is None:
                setup = workdir_script(self.spec.workdir) if self.spec.workdir else "true"
                shell = _Shell(self.conn, setup)
                out, _, code = shell.setup
                if code != 0:
                    shell.close()
                    mark = [ln for ln in out.splitlines() if ln.startswith(_WORKDIR_MARK)]
                    words = mark[-1].split()[1:] if mark else [f"exit {code}"]
                    raise WorkdirError(workdir_problem(self.spec, words))
                self._shell = shell
            shell = self._shell
        return shell if shell.lock.acquire(blocking=False) else None

    def _checked(self) -> None:
        """Open the node's shell (and so check its workdir) before a file transfer."""
        shell = self._free_shell()
        if shell is not None:
            shell.lock.release()

    def _drop_shell(self, shell: _Shell) -> None:
        with self._shell_lock:
            if self._shell is shell:
                self._shell = None
        shell.close()

    def put(self, local: str | Path, remote: str) -> None:
        self._checked()
        self.conn.put(str(local), remote)

    def get(self, remote: str, local: str | Path) -> None:
        self._checked()
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        self.conn.get(remote, str(local))

    def fetch_tree(self, remote: str, local: str | Path, remove: bool = True) -> None:
        """Copy the files of directory ``remote`` into ``local`` as one tar stream over one SSH
        command (per-file SFTP costs round trips per file), then, with ``remove``, delete
        ``remote``. A missing ``remote`` copies nothing."""
        Path(local).mkdir(parents=True, exist_ok=True)
        d = shlex.quote(remote)
        rm = f"rm -rf {d}; " if remove else ""
        self._checked()
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
