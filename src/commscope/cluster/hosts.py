"""Nodes reached over SSH: one interface for the netns backend and for real hosts.

Every action on a node (commands, file transfer) goes through :class:`Host`, a thin wrapper
around a fabric ``Connection`` that *verifies host keys*: fabric sets paramiko's AutoAddPolicy and
loads no known_hosts file (fabric #2071, #1804), so we load the cluster's known_hosts ourselves
and reject unknown keys.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import paramiko
from fabric import Connection
from invoke.runners import Result


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

    @property
    def name(self) -> str:
        return self.spec.name

    def run(
        self,
        cmd: str,
        *,
        timeout: float | None = None,
        warn: bool = False,
        env: dict[str, str] | None = None,
        hide: bool | str = True,
    ) -> Result:
        """Run a shell command on the node. ``env`` is exported inline (sshd drops SendEnv)."""
        if env:
            exports = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items())
            cmd = f"export {exports}; {cmd}"
        return self.conn.run(cmd, timeout=timeout, warn=warn, hide=hide, in_stream=False)

    def put(self, local: str | Path, remote: str) -> None:
        self.conn.put(str(local), remote)

    def get(self, remote: str, local: str | Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        self.conn.get(remote, str(local))

    def close(self) -> None:
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
    failure (in host order) is raised, so cleanup steps never skip a node.
    """
    if len(hosts) <= 1:
        return [fn(h) for h in hosts]
    with ThreadPoolExecutor(len(hosts)) as pool:
        futures = [pool.submit(fn, h) for h in hosts]
        wait(futures)
    for fut in futures:
        if fut.exception() is not None:
            raise fut.exception()
    return [fut.result() for fut in futures]
