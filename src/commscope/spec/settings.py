"""Typed settings the runner passes around: one sweep cell, the ``run:`` block, the ``cluster:``
block, the ``microbench:`` block's benchmark settings and the workload torchrun starts. Frozen
and torch-free; each is built once from its config mapping (Snakemake's ``params``, already
validated against the schema and given its defaults) with ``from_mapping``, which rejects
unknown keys so that a renamed key fails loudly instead of being ignored.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from commscope.spec.link import LINK_AXES, LINK_DEFAULTS, LINK_ENGINES, LinkSetting, LinkShape
from commscope.spec.topology import Topology

# The experiment links' MTU (bytes of IP packet; a frame adds 14 bytes of Ethernet header).
# 576 is the smallest datagram every IPv4 host must accept (RFC 791); 65535 is veth's maximum.
DEFAULT_MTU = 1500
MIN_MTU, MAX_MTU = 576, 65535


def check_mtu(mtu: int) -> None:
    """ValueError naming ``cluster.mtu`` and the range unless ``mtu`` is an MTU we can set."""
    if isinstance(mtu, bool) or not isinstance(mtu, int) or not MIN_MTU <= mtu <= MAX_MTU:
        raise ValueError(
            f"cluster.mtu={mtu!r}: use an MTU between {MIN_MTU} and {MAX_MTU} bytes "
            "(1500: standard Ethernet, 9000: jumbo frames)"
        )


# Where an emulated cluster's subnets may lie: the private ranges (RFC 1918) and the benchmarking
# range (RFC 2544, 198.18.0.0/15, the default's). Anything else may be a real network the host
# reaches: a bridge address in it would take those routes over (0.0.0.0/1 beats the default).
ALLOWED_SUBNETS = tuple(
    ipaddress.IPv4Network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "198.18.0.0/15")
)
# A /16 holds 65,534 nodes, far past any cluster; a /29 the 3 addresses and 5 nodes at least.
SUBNET_PREFIX = (16, 29)


def subnet_problem(subnet: str, field: str) -> str:
    """Why ``subnet`` cannot be an emulated cluster's network ('' when it can): not an IPv4
    network in canonical form, outside :data:`ALLOWED_SUBNETS`, or a prefix outside
    :data:`SUBNET_PREFIX`. The message names ``field`` and the fix."""
    try:
        net = ipaddress.ip_network(subnet, strict=True)
    except ValueError as exc:
        return f"{field}={subnet!r} is not a network such as '198.18.0.0/24': {exc}"
    if net.version != 4:
        return f"{field}={subnet!r} must be an IPv4 network such as '198.18.0.0/24'"
    if not any(net.subnet_of(allowed) for allowed in ALLOWED_SUBNETS):
        ranges = ", ".join(map(str, ALLOWED_SUBNETS))
        return (
            f"{field}={subnet} is not inside a private or benchmarking range ({ranges}): "
            "an emulated cluster must not shadow a network this host can reach"
        )
    low, high = SUBNET_PREFIX
    if not low <= net.prefixlen <= high:
        return f"{field}={subnet}: use a prefix from /{low} to /{high} (e.g. '198.18.0.0/24')"
    return ""


def _as_int(value: Any) -> int:
    """An integer setting: ints and integral strings; ValueError for anything else."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError("not an integer")
    try:
        return int(value)
    except ValueError:
        raise ValueError("not an integer") from None


def _as_bool(value: Any) -> bool:
    """A boolean setting: True/False, or the strings true/false (any case)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ValueError("not a boolean (true or false)")
    return text == "true"


def _known(cls: type, mapping: Mapping[str, Any], what: str) -> dict[str, Any]:
    """``mapping`` as keyword arguments of ``cls``; ValueError naming any key it does not have."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(mapping) - names)
    if unknown:
        raise ValueError(f"{what}: unknown keys {unknown}; known: {sorted(names)}")
    return dict(mapping)


@dataclass(frozen=True)
class CellSettings:
    """Where a cell runs and how its links are shaped, plus the training axes when it trains.

    ``nodes`` x ``ranks_per_node`` ranks; ``bw``/``delay``/``jitter``/``loss``/``cc`` as the sweep
    writes them (``loss`` path-safe, e.g. ``0.5pct``). ``strategy``, ``model``, ``steps`` and
    ``repeat`` are None for a cell that does not train (the microbenchmark). Field order is the
    sweep's.
    """

    nodes: int
    ranks_per_node: int
    bw: str
    delay: str = LINK_DEFAULTS["delay"]
    jitter: str = LINK_DEFAULTS["jitter"]
    loss: str = LINK_DEFAULTS["loss"]
    cc: str = LINK_DEFAULTS["cc"]
    strategy: str | None = None
    model: str | None = None
    steps: int | None = None
    repeat: int | None = None

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.ranks_per_node < 1:
            raise ValueError(
                f"cell needs nodes >= 1 and ranks_per_node >= 1, got {self.nodes} and "
                f"{self.ranks_per_node}"
            )

    @classmethod
    def from_mapping(cls, cell: Mapping[str, Any]) -> CellSettings:
        """From a cell's sweep values (a Paramspace instance, or a dict with the same keys)."""
        kw = _known(cls, cell, "cell")
        for key in ("nodes", "ranks_per_node", "steps", "repeat"):
            if kw.get(key) is not None:
                kw[key] = int(kw[key])
        for key in (*LINK_AXES, "strategy", "model"):
            if kw.get(key) is not None:
                kw[key] = str(kw[key])
        return cls(**kw)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def link(self) -> LinkSetting:
        """The cell's link setting (its bw, delay, jitter, loss and cc)."""
        return LinkSetting(self.bw, self.delay, self.jitter, self.loss, self.cc)

    def link_shape(self) -> LinkShape:
        """The tc shape the cell asks for."""
        return self.link.shape()

    def as_dict(self) -> dict[str, Any]:
        """The axes this cell sets, in the sweep's order (as the config wrote them)."""
        order = ("strategy", "model", "nodes", "ranks_per_node", *LINK_AXES)
        values = {k: getattr(self, k) for k in (*order, "steps", "repeat")}
        return {k: v for k, v in values.items() if v is not None}


# Bounds of run.socket_hz other than 0 (off): one sock_diag query costs ~0.5 ms of CPU, so
# 100 Hz is 5 % of a core per node and faster only spins; every rank lingers 1.5 sampler
# periods at its end (experiment.launch), so below 1 Hz a cell waits seconds for nothing.
MIN_SOCKET_HZ = 1.0
MAX_SOCKET_HZ = 100.0
# Where the wire's bytes come from (run.wire): see RunSettings.
WIRE_SOURCES: tuple[str, ...] = ("bpf", "counters")
# How each node starts its ranks (run.launcher): see RunSettings.
LAUNCHERS: tuple[str, ...] = ("warm", "torchrun")


# The most attempts a cell may get (each may take up to run.timeout_s).
MAX_ATTEMPTS = 10


@dataclass(frozen=True)
class RunSettings:
    """The config's ``run:`` block: how long a cell may take and what is measured beside it.

    ``timeout_s`` bounds torchrun on every node (and the process-group timeout); ``wire`` is
    the source of the wire's bytes over time and per node pair: ``bpf`` (the in-kernel
    accounting of :mod:`commscope.node.wire`, ``wire_bin_us`` wide bins) or ``counters`` (the
    /proc sampler at ``sample_hz`` plus a packet capture for the node-pair matrix); ``bpf``
    falls back to ``counters`` where the program cannot be built or attached, with the reason in
    the log and the report. ``socket_hz`` is the socket statistics rate (0: off); ``pcap``
    captures packet headers with tcpdump: True always, False never, None (default) when the
    wire source is ``counters`` (the node-pair matrix comes from the capture then);
    ``master_port`` is torchrun's rendezvous port. ``link_engine`` applies the cells' delay,
    jitter and loss: ``netem``, ``nfqueue`` (nftables random drop and the NFQUEUE delayer of
    :mod:`commscope.node.delayer`) or ``auto`` (netem where the node's kernel has it).
    ``launcher`` starts the ranks: ``warm`` (default) forks them, with torchrun's environment,
    from a per-node server that has imported torch and the workload already
    (:mod:`commscope.node.forkserver`); ``torchrun`` runs torchrun on every node.
    ``attempts``: how many times a cell is tried while it fails transiently
    (:mod:`commscope.experiment.attempts`).
    """

    timeout_s: float = 300.0
    sample_hz: int = 1000
    warmup_steps: int = 2
    master_port: int = 29500
    socket_hz: float = 10.0
    pcap: bool | None = None
    wire: str = "bpf"
    wire_bin_us: float = 100.0
    link_engine: str = "auto"
    launcher: str = "warm"
    attempts: int = 3

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"run.timeout_s={self.timeout_s} must be > 0")
        if not 1 <= self.attempts <= MAX_ATTEMPTS:
            raise ValueError(
                f"run.attempts={self.attempts}: use 1 (no retry) to {MAX_ATTEMPTS} (a cell that "
                "failed transiently is tried again, commscope.experiment.attempts)"
            )
        if self.link_engine not in LINK_ENGINES:
            raise ValueError(
                f"run.link_engine={self.link_engine!r}: use one of {list(LINK_ENGINES)} (auto: "
                "netem where the kernel has it, else nftables loss and the NFQUEUE delayer)"
            )
        if self.launcher not in LAUNCHERS:
            raise ValueError(
                f"run.launcher={self.launcher!r}: use one of {list(LAUNCHERS)} (warm: ranks "
                "forked from a per-node server with torch imported; torchrun: torchrun per node)"
            )
        if self.wire not in WIRE_SOURCES:
            raise ValueError(
                f"run.wire={self.wire!r}: use one of {list(WIRE_SOURCES)} (bpf: in-kernel "
                "accounting, the default; counters: the /proc sampler and tcpdump)"
            )
        if not 1 <= self.wire_bin_us <= 1_000_000 or self.wire_bin_us * 1000 != self.wire_bin_ns:
            raise ValueError(
                f"run.wire_bin_us={self.wire_bin_us} must be a whole number of ns between 1 us "
                "and 1 s (e.g. 100 or 10)"
            )
        if self.sample_hz < 1:
            raise ValueError(f"run.sample_hz={self.sample_hz} must be >= 1")
        if self.socket_hz != 0 and not MIN_SOCKET_HZ <= self.socket_hz <= MAX_SOCKET_HZ:
            raise ValueError(
                f"run.socket_hz={self.socket_hz}: use 0 (off) or {MIN_SOCKET_HZ:g} to "
                f"{MAX_SOCKET_HZ:g} Hz (one query costs ~0.5 ms of CPU: faster, the sampler "
                "only spins; slower, every rank lingers 1.5 periods at its end)"
            )

    @classmethod
    def from_mapping(cls, run: Mapping[str, Any]) -> RunSettings:
        kw = _known(cls, run, "run")
        casts = {
            "timeout_s": float,
            "sample_hz": int,
            "warmup_steps": int,
            "master_port": int,
            "socket_hz": float,
            "pcap": lambda v: None if v is None else bool(v),
            "wire": str,
            "wire_bin_us": float,
            "link_engine": str,
            "launcher": str,
            "attempts": int,
        }
        return cls(**{k: casts[k](v) for k, v in kw.items()})

    @property
    def wire_bin_ns(self) -> int:
        """The BPF accounting's bin width in ns."""
        return round(self.wire_bin_us * 1000)


@dataclass(frozen=True)
class ClusterSettings:
    """The config's ``cluster:`` block: which backend, its name (state dir, namespaces), the
    netns subnets and experiment links, the ssh inventory, and how long an SSH connect may take.

    ``mtu`` and ``offload`` shape the netns cluster's experiment veths: their MTU (1500, or
    jumbo frames such as 9000) and whether TSO/GSO stay on (``False``, the default: the veths
    carry MTU-sized frames as a real wire does; ``True``: up to 64 KB GSO super-packets, the
    behaviour before frames). Real hosts (ssh) keep their NIC's settings; they are recorded.
    """

    backend: str = "netns"
    name: str = "cs"
    mgmt_subnet: str = "198.18.0.0/24"
    exp_subnet: str = "198.19.0.0/24"
    inventory: str = "config/cluster.yaml"
    connect_timeout_s: float = 10.0
    mtu: int = DEFAULT_MTU
    offload: bool = False
    # The experiment network's shape: flat (one switch) or leaf-spine (spec.topology).
    topology: Topology = field(default_factory=Topology)

    def __post_init__(self) -> None:
        if self.backend not in ("netns", "ssh"):
            raise ValueError(f"cluster.backend={self.backend!r}: use 'netns' or 'ssh'")
        check_mtu(self.mtu)

    @classmethod
    def from_mapping(cls, cluster: Mapping[str, Any]) -> ClusterSettings:
        kw = _known(cls, cluster, "cluster")
        casts: dict[str, Any] = {
            "connect_timeout_s": float,
            "mtu": _as_int,
            "offload": _as_bool,
            "topology": Topology.from_mapping,
        }
        typed = {}
        for key, value in kw.items():
            try:
                typed[key] = casts.get(key, str)(value)
            except (TypeError, ValueError) as err:
                if key == "topology":  # its messages name their own key
                    raise
                raise ValueError(f"cluster.{key}={value!r}: {err}") from None
        return cls(**typed)


def benchmark_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """Sizes from ``min_bytes`` up to ``max_bytes`` (included when on the grid), each ``factor``
    times the last: 1 KiB .. 64 MiB by 4 gives 1K, 4K, 16K, ..., 64M (9 sizes)."""
    if min_bytes < 4 or max_bytes < min_bytes or factor < 2:
        raise ValueError(
            f"microbench sizes: need 4 <= min_bytes <= max_bytes and factor >= 2 "
            f"(got min_bytes={min_bytes}, max_bytes={max_bytes}, factor={factor})"
        )
    sizes = []
    size = int(min_bytes)
    while size <= max_bytes:
        sizes.append(size)
        size *= int(factor)
    return sizes


# Keys of the config's ``microbench:`` block that choose whether and on which links the
# benchmark runs, not how: not part of :class:`MicrobenchSettings` (editing them reruns no
# benchmark).
MICROBENCH_SCOPE_KEYS: tuple[str, ...] = ("enabled", "links")


@dataclass(frozen=True)
class MicrobenchSettings:
    """The config's ``microbench:`` block less :data:`MICROBENCH_SCOPE_KEYS`: how one link
    setting is benchmarked (docs/microbench.md; the schema describes each key).

    ``nodes`` x ``ranks_per_node`` ranks run ``ops`` at :attr:`sizes` (``min_bytes`` times
    powers of ``factor`` up to ``max_bytes``); per (op, size) ``warmup_iters`` untimed
    iterations while one takes at most ``warmup_max_s``, then ``budget_s`` worth of timed ones
    clamped to [``min_iters``, ``max_iters``], sizes skipped once one is expected to take longer
    than ``max_op_s``. No defaults here: the schema fills them (one place for them).
    """

    nodes: int
    ranks_per_node: int
    ops: tuple[str, ...]
    min_bytes: int
    max_bytes: int
    factor: int
    budget_s: float
    max_op_s: float
    min_iters: int
    max_iters: int
    warmup_iters: int
    warmup_max_s: float

    def __post_init__(self) -> None:
        benchmark_sizes(self.min_bytes, self.max_bytes, self.factor)  # raises naming the keys

    @classmethod
    def from_mapping(cls, microbench: Mapping[str, Any]) -> MicrobenchSettings:
        """From the block's benchmark keys (no ``enabled``/``links``: :meth:`from_block` drops
        them)."""
        kw = _known(cls, microbench, "microbench")
        ints = ("nodes", "ranks_per_node", "min_bytes", "max_bytes", "factor", "min_iters",
                "max_iters", "warmup_iters")  # fmt: skip
        for key in ints:
            if key in kw:
                kw[key] = int(kw[key])
        for key in ("budget_s", "max_op_s", "warmup_max_s"):
            if key in kw:
                kw[key] = float(kw[key])
        if "ops" in kw:
            kw["ops"] = tuple(str(op) for op in kw["ops"])
        return cls(**kw)

    @classmethod
    def from_block(cls, microbench: Mapping[str, Any]) -> MicrobenchSettings:
        """From the whole ``microbench:`` block, less :data:`MICROBENCH_SCOPE_KEYS`."""
        return cls.from_mapping(
            {k: v for k, v in microbench.items() if k not in MICROBENCH_SCOPE_KEYS}
        )

    @property
    def sizes(self) -> list[int]:
        """The message sizes benchmarked (:func:`benchmark_sizes`)."""
        return benchmark_sizes(self.min_bytes, self.max_bytes, self.factor)


@dataclass(frozen=True)
class Workload:
    """What torchrun starts on every rank: ``python -m <module> <spec.json>``.

    ``spec`` is the JSON payload the module reads (the runner adds ``out_dir`` and ``node``):
    the training run spec of :func:`commscope.experiment.launch.training_workload`, the
    microbenchmark's (:func:`commscope.bench.run.bench_spec`) or a replay's.

    ``files`` are copied into every node's run directory before the ranks start, under the
    given names (a replay's program: too large for the spec, which travels on a command line).
    """

    module: str
    spec: Mapping[str, Any]
    files: Mapping[str, Path] = field(default_factory=dict)
