"""What a cell measures beside the workload, one object per probe, each started before torchrun
and stopped after it.

On the node, in the background (:class:`NodeTool`): the in-kernel wire accounting (or, where
it cannot run, the interface counter sampler and the packet capture), the socket statistics.
From the orchestrator (:class:`Probe`): the clock offset.
Round trips are batched: all node tools start in ONE SSH command and stop in another
(:class:`NodeTools`), and :class:`CellProbes` reads the link's facts and qdisc counters in
that same command while, on a second SSH channel, the clock probe runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from shlex import quote
from typing import Any, Protocol, TypeVar

from commscope.cluster.clock import estimate_offset
from commscope.cluster.hosts import Host, NodeSpec
from commscope.cluster.shaping import (
    link_facts_script,
    parse_link_facts,
    parse_qdisc_stats,
    qdisc_stats_script,
)
from commscope.contracts import (
    HOSTSTAT_READY,
    NODE_COUNTERS_FILE,
    NODE_HOST_FILE,
    NODE_SOCKETS_FILE,
    NODE_WIRE_FILE,
    NODE_WIRE_META_FILE,
    SOCKSTATS_READY,
)
from commscope.experiment.launch import tag_pattern
from commscope.node.wire import build_object, ring_slots
from commscope.spec.settings import RunSettings

T_co = TypeVar("T_co", covariant=True)


# Every value below that reaches a node's shell (paths under the node's workdir, the interface,
# the addresses, the tag) is quoted with shlex.quote where it is used; the constants (module
# names, file names of the run directory) are plain words and stay as they are.
def _tool_pattern(name: str, tag: str) -> str:
    """A pgrep/pkill pattern for ``name`` with this cell's ``tag`` later on its command line,
    quoted for the shell as one word (see :func:`~commscope.experiment.launch.tag_pattern`)."""
    return tag_pattern(f"{name}.*{tag}")


SAMPLER_MODULE = "commscope.node.sampler"
SOCKSTATS_MODULE = "commscope.node.sockstats"
HOSTSTAT_MODULE = "commscope.node.hoststat"
# Twice a second: per-second CPU shares from /proc/stat's 10 ms ticks (1 % resolution on two
# CPUs), at ~1 ms of CPU per sample and node.
HOSTSTAT_HZ = 2.0
ENABLE_HOST_STATS = True
# How long a cell's stop waits for its node tools to write their outputs and exit.
STOP_WAIT_S = 20
WIRE_MODULE = "commscope.node.wire"
# Where a node keeps the BPF object shipped to it, in the cell's run directory.
WIRE_OBJECT = "wire.bpf.o"
WIRE_LOG = "wire.log"
# How long a node tool may take to say it runs. A deadline, not a count of polls: on two busy
# cores each poll takes longer than its sleep, and a count of 50 polls once gave tcpdump well
# under its 5 s (a failed attempt of a cell, issue 23). Each cell's tools log into the cell's own
# run directory (its fresh tag), so a wait never reads an earlier start's line.
TOOL_START_S = 30


def until(test: str, also: str = "", seconds: int = TOOL_START_S) -> str:
    """Shell lines that poll ``test`` (a command) every 20 ms until it succeeds, ``also``
    succeeds (a failure worth stopping at), or ``seconds`` have passed; the caller checks."""
    stop = f"{test} && break; " + (f"{also} && break; " if also else "")
    return (
        f"end=$(( $(date +%s) + {int(seconds)} )); "
        f"while [ $(date +%s) -le $end ]; do {stop}sleep 0.02; done"
    )


class Probe(Protocol[T_co]):
    """A measurement of one node taken at the start and at the end of a cell."""

    def start(self, host: Host) -> T_co: ...

    def stop(self, host: Host) -> T_co: ...


class ClockProbe:
    """The node's clock offset (Cristian's algorithm over its own SSH channel), at start and end:
    ``{"start": sample}`` and ``{"end": sample}``."""

    def start(self, host: Host) -> dict[str, Any]:
        return {"start": estimate_offset(host).as_dict()}

    def stop(self, host: Host) -> dict[str, Any]:
        return {"end": estimate_offset(host).as_dict()}


# ──────────────────────────────────────────────────────────────────────────── node tools


class NodeTool(Protocol):
    """A program run in the background on a node for the duration of the cell: how to start it,
    how to find it again (to stop it), and what it leaves behind."""

    def command(self, node: NodeSpec, rdir: str) -> str:
        """The shell command that runs it (in ``rdir``; the caller backgrounds it)."""
        ...

    def ready(self, rdir: str) -> str:
        """Shell lines that wait until it is running ('' when it needs no wait)."""
        ...

    def pattern(self) -> str:
        """A pgrep/pkill pattern that finds exactly this cell's instance (shell-quoted)."""
        ...

    def output(self, rdir: str) -> str | None:
        """The file it renames into place when stopped, or None (nothing to wait for)."""
        ...

    def after_stop(self, rdir: str) -> str:
        """A shell step to run once it has exited ('' for none)."""
        ...


@dataclass(frozen=True)
class PeriodicSampler:
    """A commscope node program that samples at ``hz`` into one parquet file until stopped (or
    ``limit_s``): the interface counters (:func:`counter_sampler`) or the TCP socket statistics
    (:func:`socket_stats`)."""

    module: str
    option: str  # the program's option naming what it samples ...
    node_field: str  # ... and the NodeSpec field that gives its value
    hz: float
    limit_s: float
    tag: str
    table: str  # the file it writes in the node's run directory
    log: str
    ready_line: str  # what it prints to its log once it samples: training waits for it

    def command(self, node: NodeSpec, rdir: str) -> str:
        value = quote(getattr(node, self.node_field))
        return (
            f"{quote(node.python)} -m {self.module} {self.option} {value} "
            f"--hz {self.hz} --out {quote(f'{rdir}/{self.table}')} --max-seconds {self.limit_s} "
            f"--tag {quote(self.tag)} > {self.log} 2>&1"
        )

    def ready(self, rdir: str) -> str:
        # Training must not start before it samples: a short cell could end unsampled.
        log, line = quote(f"{rdir}/{self.log}"), quote(self.ready_line)
        return (
            f" {until(f'grep -qF {line} {log}')}; "
            f"grep -qF {line} {log} || {{ echo '{self.module} did not start:' >&2; "
            f"cat {log} >&2; exit 1; }};"
        )

    def pattern(self) -> str:
        return _tool_pattern(self.module, self.tag)

    def output(self, rdir: str) -> str | None:
        return f"{rdir}/{self.table}"

    def after_stop(self, rdir: str) -> str:
        return ""


def counter_sampler(hz: int, limit_s: float, tag: str) -> PeriodicSampler:
    """Interface byte/packet counters at ``hz`` (:mod:`commscope.node.sampler`)."""
    return PeriodicSampler(
        SAMPLER_MODULE, "--iface", "exp_iface", hz, limit_s, tag, NODE_COUNTERS_FILE,
        "sampler.log", "commscope.node.sampler: ",
    )  # fmt: skip


def host_stats(limit_s: float, tag: str) -> PeriodicSampler:
    """The host's CPU and the node's run-queue waits at HOSTSTAT_HZ
    (:mod:`commscope.node.hoststat`): the cell's fidelity record."""
    return PeriodicSampler(
        HOSTSTAT_MODULE, "--node", "exp_addr", HOSTSTAT_HZ, limit_s, tag, NODE_HOST_FILE,
        "hoststat.log", HOSTSTAT_READY,
    )  # fmt: skip


def socket_stats(hz: float, limit_s: float, tag: str) -> PeriodicSampler:
    """TCP's own view of every training socket at ``hz`` (:mod:`commscope.node.sockstats`)."""
    return PeriodicSampler(
        SOCKSTATS_MODULE, "--addr", "exp_addr", hz, limit_s, tag, NODE_SOCKETS_FILE,
        "sockstats.log", SOCKSTATS_READY,
    )  # fmt: skip


@dataclass(frozen=True)
class PacketCapture:
    """Packet headers (96 bytes) of the experiment interface with tcpdump, gzipped when done."""

    limit_s: float
    tag: str

    def command(self, node: NodeSpec, rdir: str) -> str:
        # -Z root: write as root (tcpdump otherwise drops to user tcpdump after opening).
        # --immediate-mode: hand every packet over at once; with the default buffer timeout
        # the last ~1 s of packets still sat in the kernel ring when the stop's SIGTERM came
        # right after training (measured: 34 of 927 packets written).
        # The file name carries the tag, so the stop step can find this tcpdump.
        return (
            f"timeout {int(self.limit_s)} tcpdump -i {quote(node.exp_iface)} -s 96 -n -Z root "
            f"--immediate-mode --time-stamp-precision=nano -w {quote(f'{rdir}/{self.tag}.pcap')} "
            "> tcpdump.log 2>&1"
        )

    def ready(self, rdir: str) -> str:
        # Capture must be running before training starts, or first packets are lost.
        log = quote(f"{rdir}/tcpdump.log")
        return (
            f" {until(f'grep -q listening.on {log}')}; "
            f"grep -q 'listening on' {log} && exit 0; echo 'tcpdump did not start:' >&2; "
            f"cat {log} >&2; exit 1"
        )

    def pattern(self) -> str:
        return _tool_pattern("tcpdump", self.tag)

    def output(self, rdir: str) -> str | None:
        return None

    def after_stop(self, rdir: str) -> str:
        # Headers of a capped run are ~100 B per 1.5 KB frame; gzip takes them to a fraction
        # before they cross SSH (training is over: the CPU is free).
        return f"; gzip -1 -f {quote(f'{rdir}/{self.tag}.pcap')}"


def sudo(node: NodeSpec) -> str:
    """``sudo -n `` for a non-root SSH user (tc and bpf() need root), else ''."""
    return "" if node.user == "root" else "sudo -n "


@dataclass(frozen=True)
class WireAccounting:
    """The in-kernel wire accounting (:mod:`commscope.node.wire`): attached before training,
    drained while it runs, detached and written when stopped. ``peers`` are the cell's
    experiment addresses (slot order), ``slots`` the ring length the object was built for."""

    bin_ns: int
    slots: int
    peers: tuple[str, ...]
    limit_s: float
    tag: str

    def command(self, node: NodeSpec, rdir: str) -> str:
        # sudo(node) is one of two fixed prefixes, shell text on purpose.
        py, iface = quote(node.python), quote(node.exp_iface)
        return (
            f"{sudo(node)}{py} -m {WIRE_MODULE} run --iface {iface} "
            f"--obj {quote(f'{rdir}/{WIRE_OBJECT}')} --bin-ns {self.bin_ns} --slots {self.slots} "
            f"--peers {quote(','.join(self.peers))} --out {quote(f'{rdir}/{NODE_WIRE_FILE}')} "
            f"--meta {quote(f'{rdir}/{NODE_WIRE_META_FILE}')} --max-seconds {self.limit_s} "
            f"--tag {quote(self.tag)} > {WIRE_LOG} 2>&1"
        )

    def ready(self, rdir: str) -> str:
        # Training must not start before the filters are attached: first bytes would be lost.
        log = quote(f"{rdir}/{WIRE_LOG}")
        return (
            f" {until(f'grep -q ^attached {log}', also=f'grep -q Error {log}')}; "
            f"grep -q '^attached' {log} || {{ echo 'wire accounting did not start:'"
            f" >&2; cat {log} >&2; exit 1; }};"
        )

    def pattern(self) -> str:
        return _tool_pattern(WIRE_MODULE, self.tag)

    def output(self, rdir: str) -> str | None:
        return f"{rdir}/{NODE_WIRE_FILE}"

    def after_stop(self, rdir: str) -> str:
        return ""


def wire_cache(host: Host, obj: Path) -> str:
    """Where ``host`` keeps the BPF object ``obj`` between cells (its name carries the hash of
    the source and parameters). Beside it, ``<path>.ok-<kernel release>`` marks that the node's
    running kernel accepted it (:func:`check_wire`), so later cells skip the check; the marker
    says nothing of the bytes: every copy a cell loads is compared with ``obj`` first."""
    return f"{host.spec.workdir}/cache/{obj.name}"


def same_bytes_script(path: str, obj: Path) -> str:
    """A shell test, true when the node's file ``path`` holds exactly the orchestrator's
    ``obj`` (their SHA-256 agree): what tc loads is what was built, whatever the cache holds."""
    digest = hashlib.sha256(obj.read_bytes()).hexdigest()
    return f'[ "$(sha256sum < {quote(path)})" = "{digest}  -" ]'


def cached_wire_script(host: Host, obj: Path, rdir: str) -> str:
    """Shell lines that copy the cached, checked object into ``rdir`` and print ``@@wire-ok``
    (nothing when the node has not checked this object on its running kernel yet, or when the
    copy is not ``obj`` byte for byte: then the copy and the marker go, and :func:`check_wire`
    ships ``obj`` again)."""
    cache = wire_cache(host, obj)
    ok = f'{quote(f"{cache}.ok-")}"$(uname -r)"'  # the kernel release appended inside the word
    copy = f"{rdir}/{WIRE_OBJECT}"
    return (
        f"if test -e {ok}; then cp {quote(cache)} {quote(copy)} && "
        f"{same_bytes_script(copy, obj)} && echo @@wire-ok || rm -f {quote(copy)} {ok}; fi"
    )


def check_wire(host: Host, obj: Path, rdir: str) -> str | None:
    """Ship the BPF object ``obj`` to ``host``'s cache and attach it there once (``python -m
    commscope.node.wire check``), then copy it to ``rdir``: None when it can, else why not (the
    node's answer, its tail). The shipped file and the copy are compared with ``obj`` before
    they are loaded."""
    spec = host.spec
    cache = wire_cache(host, obj)
    host.run(f"mkdir -p {quote(str(Path(cache).parent))}")
    host.put(obj, f"{cache}.tmp")
    tmp, ok = quote(f"{cache}.tmp"), f'{quote(f"{cache}.ok-")}"$(uname -r)"'
    copy = f"{rdir}/{WIRE_OBJECT}"
    changed = "{ echo 'the BPF object on the node is not the one shipped to it' >&2; exit 1; }"
    res = host.run(
        f"{{ {same_bytes_script(f'{cache}.tmp', obj)} || {changed}; }} && "
        f"{sudo(spec)}{quote(spec.python)} -m {WIRE_MODULE} check "
        f"--iface {quote(spec.exp_iface)} --obj {tmp} && mv {tmp} {quote(cache)} && "
        f"touch {ok} && cp {quote(cache)} {quote(copy)} && "
        f"{{ {same_bytes_script(copy, obj)} || {changed}; }}",
        warn=True,
    )
    return None if res.ok else (res.stdout + res.stderr).strip()[-400:]


def build_wire_object(run: RunSettings, max_peers: int, cache_dir: Path) -> Path:
    """The BPF object for ``run``'s bin width and ``max_peers`` peer slots, built (or found) in
    ``cache_dir`` on this machine, the orchestrator. Raises WireError saying what is missing."""
    return build_object(run.wire_bin_ns, ring_slots(run.wire_bin_ns), max_peers, cache_dir)


@dataclass(frozen=True)
class WireSource:
    """How a cell measures its wire: ``bpf`` (with the bin width and ring length of the object
    shipped to the nodes) or ``counters`` (the /proc sampler and a packet capture), and why a
    ``bpf`` request fell back to ``counters`` (None when it did not)."""

    source: str
    bin_ns: int = 0
    slots: int = 0
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "bin_ns": self.bin_ns, "reason": self.reason}


def capture_packets(run: RunSettings, wire: WireSource) -> bool:
    """Whether the cell captures packet headers: ``run.pcap`` when set, else only where the
    wire source is the counters (then the node-pair matrix comes from the capture)."""
    return bool(run.pcap) if run.pcap is not None else wire.source != "bpf"


def node_tools(
    run: RunSettings, tag: str, wire: WireSource, peers: tuple[str, ...] = ()
) -> list[NodeTool]:
    """The background tools of a cell: the wire source's (BPF accounting, or the counter
    sampler and a packet capture for the node-pair matrix), then the socket statistics, the
    host statistics (the cell's fidelity) and, if asked, a packet capture (the capture comes
    last: stopping waits for it to flush)."""
    limit = float(run.timeout_s) + 30
    tools: list[NodeTool] = []
    if wire.source == "bpf":
        tools.append(WireAccounting(wire.bin_ns, wire.slots, peers, limit, tag))
    else:
        tools.append(counter_sampler(int(run.sample_hz), limit, tag))
    if run.socket_hz > 0:
        tools.append(socket_stats(run.socket_hz, limit, tag))
    # The host statistics (the fidelity monitor, docs/fidelity.md), on in every cell. They once
    # made the BPF wire accounting's ring overrun: the wire tool imported pandas after attaching,
    # beside the monitor's own import; it imports before attaching now.
    if ENABLE_HOST_STATS:
        tools.append(host_stats(limit, tag))
    if capture_packets(run, wire):
        tools.append(PacketCapture(limit, tag))
    return tools


@dataclass(frozen=True)
class NodeTools:
    """Every node tool of a cell: the shell lines that start them all and stop them all (run in
    :class:`CellProbes`' one command per node)."""

    tools: list[NodeTool]
    remote_dirs: Mapping[str, str]

    def start_script(self, host: Host) -> str:
        """The shell lines that start every tool on ``host`` and wait until they run."""
        rdir = self.remote_dirs[host.name]
        # Background only the tools: `a && b &` would background a subshell that keeps the SSH
        # channel's stdout open, and the call would block until the tools exit.
        start = " ".join(
            f"(nohup setsid {t.command(host.spec, rdir)} < /dev/null &);" for t in self.tools
        )
        ready = "".join(t.ready(rdir) for t in self.tools)
        return f"cd {quote(rdir)} && {start}{ready}"

    def stop_script(self, host: Host) -> str:
        """The shell lines that stop every tool on ``host`` and wait for their outputs."""
        rdir = self.remote_dirs[host.name]
        outputs = [o for o in (t.output(rdir) for t in self.tools) if o is not None]
        patterns = [t.pattern() for t in self.tools]
        waits = " && ".join(f"test -e {quote(o)}" for o in outputs)
        running = " || ".join(f"pgrep -f {pat} >/dev/null" for pat in patterns)
        # Signal, then wait until every tool has exited (each renames its output into place
        # before it exits), for at most STOP_WAIT_S by the clock, not by a count of polls: on a
        # loaded host each poll is slow, and a tool that died without its output (a full disk)
        # never makes it appear.
        after = "".join(t.after_stop(rdir) for t in self.tools)
        term = "; ".join(f"pkill -TERM -f {pat}" for pat in patterns)
        # One that has not exited by then never will: nothing may outlive the cell.
        kill = "; ".join(f"pkill -KILL -f {pat}" for pat in patterns)
        return (
            f"{term}; end=$(( $(date +%s) + {STOP_WAIT_S} )); "
            f"while {{ {running}; }} && [ $(date +%s) -lt $end ]; do sleep 0.05; done; "
            f"{kill}; {waits} || echo 'sampler output missing' >&2{after}"
        )


@dataclass(frozen=True)
class CellProbes:
    """A cell's probes on one node: the link's facts, the qdisc statistics and the node tools in
    one command on the main SSH channel while the clock probe runs on a second one. ``start``
    returns (qdisc stats, ``{"start": clock sample}``, link facts); ``stop`` returns (qdisc
    stats, ``{"end": clock sample}``)."""

    tools: NodeTools
    clock: ClockProbe = ClockProbe()

    def start(self, host: Host) -> tuple[list[dict], dict[str, Any], dict[str, Any]]:
        with ThreadPoolExecutor(1) as pool:
            clock = pool.submit(self.clock.start, host)
            out = host.run(
                f"{link_facts_script(host)}; echo {_QDISC_MARK}; {qdisc_stats_script(host)}; "
                f"{self.tools.start_script(host)}"
            ).stdout
            facts, _, stats = out.partition(f"{_QDISC_MARK}\n")
            return (
                parse_qdisc_stats(host, stats),
                clock.result(),
                parse_link_facts(host.spec.exp_iface, facts),
            )

    def stop(self, host: Host) -> tuple[list[dict], dict[str, Any]]:
        with ThreadPoolExecutor(1) as pool:
            clock = pool.submit(self.clock.stop, host)
            out = host.run(
                f"{qdisc_stats_script(host)}; echo {_TOOLS_MARK}; {self.tools.stop_script(host)}",
                warn=True,
            ).stdout
            return parse_qdisc_stats(host, out.partition(f"{_TOOLS_MARK}\n")[0]), clock.result()


_QDISC_MARK = "@@commscope-qdiscs"
_TOOLS_MARK = "@@commscope-tools"
