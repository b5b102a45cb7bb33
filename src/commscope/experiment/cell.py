"""Run one sweep cell on the cluster.

Order: prepare every node → shape links → start probes (and take clocks) → the ranks on every
node over SSH (run.launcher) → stop probes (and take clocks) → unshape → fetch traces over SFTP;
ALWAYS unshape and kill what is left, also when the run failed or hung. One cell owns the
cluster at a time (an fcntl lock on the cluster state dir, on top of Snakemake's
``cluster_slot`` resource).
"""

from __future__ import annotations

import fcntl
import json
import logging
import shlex
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from paramiko.ssh_exception import SSHException

from commscope.cluster.fabric import shaped_fabric
from commscope.cluster.hosts import Cluster, Host, on_all
from commscope.cluster.provision import provision, state_dir
from commscope.cluster.shaping import ShapingError, shaped
from commscope.contracts import RUN_FILE
from commscope.experiment.launch import (
    Launcher,
    ensure_forkserver,
    kill_everywhere,
    launch_everywhere,
    new_tag,
)
from commscope.experiment.probes import (
    CellProbes,
    NodeTools,
    WireSource,
    build_wire_object,
    cached_wire_script,
    capture_packets,
    check_wire,
    node_tools,
)
from commscope.node.sampler import default_cache_dir
from commscope.node.wire import WireError, ring_slots
from commscope.spec.link import LinkShape
from commscope.spec.settings import CellSettings, ClusterSettings, RunSettings, Workload
from commscope.spec.topology import Topology

log = logging.getLogger(__name__)


class CellFailed(RuntimeError):
    """The cell's training did not finish on every node; the message carries the log tails."""


class CellCannotRun(CellFailed):
    """The cell cannot run on this cluster as configured (a missing tool, more nodes than the
    cluster has): trying it again would fail the same way (commscope.experiment.attempts)."""


class CellTimedOut(CellFailed):
    """The cell's training ran out of ``run.timeout_s``: a cap too low for its steps, a hung
    collective. Not tried again: it would most likely do the same, at ``run.timeout_s`` per
    attempt (and a Snakemake stopped by a signal to its pid waits for every attempt)."""


# What launch.exit_reason says of a node whose ranks ran out of run.timeout_s.
TIMED_OUT = "timed out (run.timeout_s="

# The phases of a cell's run, in order: a failure record names the one it failed in.
PHASES = ("provision", "prepare", "shape", "probes", "train", "stop", "fetch")


@dataclass
class Progress:
    """Where a cell's run is (set as it goes; read when it fails)."""

    phase: str = PHASES[0]


class CellInterrupted(BaseException):
    """SIGTERM reached the cell (Snakemake stopping on Ctrl-C, a kill): raised where the main
    thread is, so every ``finally`` and context manager on the way out runs (unshape, kill the
    ranks, close the connections), as for KeyboardInterrupt, which SIGINT already raises."""


@contextmanager
def signals_end_the_cell() -> Iterator[None]:
    """Turn SIGTERM into :class:`CellInterrupted` while the cell runs (main thread only: a
    signal handler can be installed nowhere else; elsewhere this does nothing). Python's
    default for SIGTERM ends the process at once, with the nodes still shaped and the ranks
    running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: Any) -> None:
        raise CellInterrupted(f"stopped by {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def cluster_lock(state_dir: Path) -> Iterator[None]:
    """Serialise cells (and re-provisioning) on one cluster, whatever runs them."""
    path = Path(state_dir) / ".cell.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def provision_and_run(
    cluster_cfg: ClusterSettings,
    cell: CellSettings,
    workload: Workload,
    run: RunSettings,
    out_dir: Path,
    root: Path | None = None,
    progress: Progress | None = None,
) -> Path:
    """Make sure the cluster is up with enough nodes (idempotent), then run the cell on it
    (``progress``, when given, follows its phases)."""
    root = root or Path.cwd()
    progress = progress or Progress()
    with signals_end_the_cell(), cluster_lock(state_dir(cluster_cfg, root)):
        progress.phase = "provision"
        cluster = provision(cluster_cfg, cell.nodes, root)
        log.info(
            "cell %s on %s cluster %s (%d nodes)",
            cell.as_dict(),
            cluster.backend,
            cluster.name,
            cluster.size,
        )
        return run_cell(
            cluster,
            cell,
            workload,
            run,
            out_dir,
            connect_timeout_s=cluster_cfg.connect_timeout_s,
            progress=progress,
        )


def run_cell(
    cluster: Cluster,
    cell: CellSettings,
    workload: Workload,
    run: RunSettings,
    out_dir: Path,
    *,
    connect_timeout_s: float = 10.0,
    progress: Progress | None = None,
) -> Path:
    """Run ``workload`` on ``cell.nodes`` nodes (the first ones, or on a leaf-spine as its
    ``placement`` picks them: numbered 0..n-1 in that order); raw traces land in ``out_dir``.

    ``run.launcher`` starts ``workload.module`` on ``cell.ranks_per_node`` ranks per node with
    the path of ``workload.spec``; the cell's link axes (bw, delay, jitter, loss) set how links are
    shaped. The caller owns the cluster for the duration (see :func:`cluster_lock`)."""
    progress = progress or Progress()
    progress.phase = "prepare"
    # Which of the cluster's nodes: the first ones, or on a leaf-spine spread over the racks
    # (spec.topology placement). The cell numbers its nodes 0..n-1 in that order.
    topology = Topology.from_mapping(cluster.extra.get("topology_block"))
    chosen = topology.place(cell.nodes)
    if cell.nodes > cluster.size or max(chosen) >= cluster.size:
        raise CellCannotRun(
            f"cell wants nodes={cell.nodes} but cluster {cluster.name} has {cluster.size}"
        )
    shape = cell.link_shape()
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = new_tag()
    specs = [replace(cluster.nodes[j], index=k) for k, j in enumerate(chosen)]
    placed = replace(cluster, nodes=specs)
    hosts = [Host(spec, connect_timeout=connect_timeout_s) for spec in specs]
    try:
        _measure(
            hosts,
            Launcher(placed, cell, run, tag, workload.module),
            workload,
            shape,
            out_dir,
            progress,
            topology,
            {spec.name: j for spec, j in zip(specs, chosen, strict=True)},
        )
    except (OSError, EOFError, SSHException, ShapingError) as err:
        # A node lost mid-cell (its sshd gone, its management link down): say which, and why.
        # Unshaping it then fails too (ShapingError, naming it); the first error says why. A
        # ShapingError of its own (a delayer that died) is the cell's failure as it is.
        if isinstance(err, ShapingError) and _node_error(err) is None:
            raise
        raise CellFailed(_lost_node(err)) from err
    finally:
        try:
            for why in kill_everywhere(hosts, tag):
                log.warning("%s", why)
        finally:
            for h in hosts:
                h.close()
    return out_dir


def _node_error(err: BaseException) -> BaseException | None:
    """The earliest exception in ``err``'s context chain that ``on_all`` marked with the node
    it came from, or None."""
    chain = [err]
    while chain[-1].__context__ is not None and len(chain) < 5:
        chain.append(chain[-1].__context__)
    return next((e for e in reversed(chain) if getattr(e, "node", None)), None)


def _lost_node(err: BaseException) -> str:
    """The message of a cell whose node stopped answering over SSH: the node (``on_all``
    marks the exception with it) and the first error, then what failed after it."""
    first = _node_error(err) or err
    node = getattr(first, "node", None) or "a node"
    # A timeout carries no text of its own: say what it means.
    detail = str(first) or ("no answer in time" if isinstance(first, TimeoutError) else "")
    text = f"{node}: lost mid-cell: {type(first).__name__}: {detail}"
    if first is not err:
        text += f"; then {type(err).__name__}: {err}"
    return (
        text + ". What could not be reached there is cleared when the cluster is next "
        "provisioned (netns) or by `commscope cleanup --inventory` (ssh hosts)"
    )


def _measure(
    hosts: list[Host],
    launcher: Launcher,
    workload: Workload,
    shape: LinkShape,
    out_dir: Path,
    progress: Progress,
    topology: Topology,
    placement: dict[str, int],
) -> None:
    """The cell's phases from preparing the nodes to writing run.json (see the module doc).
    ``topology``: the cluster's (cluster.json keeps the block it was provisioned with);
    ``placement``: each host's index in the cluster (its rack, its link overrides)."""
    run, tag, names = launcher.run, launcher.tag, [h.name for h in hosts]
    remote_dirs = {h.name: f"{h.spec.workdir}/{tag}" for h in hosts}
    # Wall-clock marks of the orchestrator's phases, kept in run.json: the cell's fixed cost.
    marks = {"begun": time.time_ns()}
    obj, why_not = _wire_object(run, len(hosts))
    cached = on_all(hosts, lambda h: _prepare(h, remote_dirs[h.name], workload, run, obj))
    log.info("prepared %d nodes", len(hosts))
    wire = _wire_source(hosts, run, obj, why_not, cached, remote_dirs)
    if wire.source == "counters":
        on_all(hosts, lambda h: _build_sampler(h, remote_dirs[h.name]))
    marks["prepared"] = time.time_ns()
    peers = tuple(h.spec.exp_addr for h in hosts)
    probes = CellProbes(NodeTools(node_tools(run, tag, wire, peers), remote_dirs))
    meta: dict[str, Any] = {
        "tag": tag,
        "launcher": run.launcher,
        "shape": shape.__dict__,
        "captures": {
            "wire": wire.source,
            "sample_hz": run.sample_hz,
            "socket_hz": run.socket_hz,
            "pcap": capture_packets(run, wire),
        },
        "wire": {**wire.as_dict(), "requested": run.wire},
    }
    # Jitter draws differ per repeat (and per node, see shaped) but are the same on a rerun.
    seed = 1000 * int(launcher.cell.repeat or 0)
    progress.phase = "shape"
    # A leaf-spine fabric: its uplinks capped for the cell, a node's own link where the
    # topology overrides it.
    extra = launcher.cluster.extra
    per_host = {h.name: topology.node_shape(placement[h.name], shape) for h in hosts}
    mtu, offload = int(extra.get("mtu", 1500)), bool(extra.get("offload", False))
    with (
        shaped(hosts, shape, run.link_engine, seed, per_host) as link,
        shaped_fabric(extra.get("fabric"), topology, shape.rate_bps, mtu, offload) as fab,
    ):
        meta["link_engine"] = link
        if fab:
            meta["fabric"] = fab
            meta["placement"] = {
                h.name: {"node": h.spec.index, "rack": topology.rack_of(placement[h.name])}
                for h in hosts
            }
            meta["node_shapes"] = {n: s.__dict__ for n, s in per_host.items() if s != shape}
        marks["shaped"] = time.time_ns()
        progress.phase = "probes"
        started = on_all(hosts, probes.start)
        meta["qdisc_before"] = {n: q for n, (q, _, _) in zip(names, started, strict=True)}
        # MTU, offloads and congestion control as the cell ran them: what a packet on the
        # wire and in the counters is (a TSO/GSO super-packet or a frame) differs by node.
        meta["links"] = {n: facts for n, (_, _, facts) in zip(names, started, strict=True)}
        log.info(
            "links shaped (%s, engine %s), samplers started, clocks probed",
            shape.describe(),
            link["engine"],
        )
        meta["t_start_ns"] = time.time_ns()
        progress.phase = "train"
        failures = launch_everywhere(hosts, launcher, remote_dirs)
        log.info("ranks ended on every node (%d failed, launcher %s)", len(failures), run.launcher)
        meta["t_end_ns"] = time.time_ns()
        progress.phase = "stop"
        stopped = on_all(hosts, probes.stop)
        marks["probes_stopped"] = time.time_ns()
        meta["qdisc_after"] = {n: q for n, (q, _) in zip(names, stopped, strict=True)}
    meta["clock"] = {
        # netns nodes read the host kernel's clock: the estimates only check the method.
        "applied": launcher.cluster.backend != "netns",
        "nodes": {
            n: {**a, **b} for n, (_, a, _), (_, b) in zip(names, started, stopped, strict=True)
        },
    }
    log.info("samplers stopped, links unshaped")
    marks["unshaped"] = time.time_ns()
    progress.phase = "fetch"
    shipped = tuple(workload.files)  # inputs, not results: not fetched back from every node
    meta["nodes"] = on_all(hosts, lambda h: _fetch(h, remote_dirs[h.name], out_dir, shipped))
    log.info("fetched every node's files")
    marks["fetched"] = time.time_ns()
    meta["timeline_ns"] = {**marks, "launched": meta["t_start_ns"], "ended": meta["t_end_ns"]}
    (out_dir / RUN_FILE).write_text(json.dumps(meta, indent=2, default=str))
    if failures:
        progress.phase = "train"
        error = CellTimedOut if any(TIMED_OUT in f for f in failures) else CellFailed
        raise error("training failed on " + "; ".join(failures))


def _wire_object(run: RunSettings, n_hosts: int) -> tuple[Path | None, str]:
    """The BPF object to ship when ``run.wire`` asks for it, built (or found) here on the
    orchestrator; else None and why ('' when the counters were asked for)."""
    if run.wire != "bpf":
        return None, ""
    try:
        return build_wire_object(run, n_hosts + 1, default_cache_dir()), ""
    except WireError as err:
        return None, f"orchestrator: {err}"


def _wire_source(
    hosts: list[Host],
    run: RunSettings,
    obj: Path | None,
    why_not: str,
    cached: list[bool],
    remote_dirs: dict[str, str],
) -> WireSource:
    """The cell's wire source: the BPF accounting where every node can attach ``obj`` (checked
    once per node and kernel, then cached: ``cached`` says which nodes had it); otherwise the
    counter sampler and tcpdump, with the reason logged (and kept in run.json for the report).
    ``run.wire: counters`` (``obj`` None, no reason) asks for the latter."""
    if obj is None:
        return _fall_back(why_not) if why_not else WireSource("counters")
    done = {h.name for h, c in zip(hosts, cached, strict=True) if c}
    found = on_all(
        hosts, lambda h: None if h.name in done else check_wire(h, obj, remote_dirs[h.name])
    )
    problems = [f"{h.name}: {why}" for h, why in zip(hosts, found, strict=True) if why]
    if problems:
        return _fall_back("; ".join(problems))
    return WireSource("bpf", run.wire_bin_ns, ring_slots(run.wire_bin_ns))


def _fall_back(reason: str) -> WireSource:
    log.warning(
        "BPF wire accounting cannot run (%s): falling back to the /proc counter sampler and "
        "tcpdump for this cell",
        reason,
    )
    return WireSource("counters", reason=reason)


def _prepare(host: Host, rdir: str, workload: Workload, run: RunSettings, obj: Path | None) -> bool:
    """In one round trip: make the node's run directory, write the spec there, start the warm
    launcher's fork server if it is not running, check that tcpdump exists when capturing, and
    copy the BPF object ``obj`` from the node's cache when it was checked there before; then
    copy the workload's files there over SFTP. Returns whether the BPF object was cached (else
    :func:`check_wire` ships and checks it)."""
    spec = {**workload.spec, "out_dir": rdir, "node": host.spec.index}
    # Exit 3 (before anything starts) when packet capture is asked for but impossible.
    check = "command -v tcpdump >/dev/null || exit 3; " if run.pcap else ""
    warm = f"{ensure_forkserver(host, workload.module)}; " if run.launcher == "warm" else ""
    wire = f"; {cached_wire_script(host, obj, rdir)}" if obj is not None else ""
    res = host.run(
        f"{check}mkdir -p {shlex.quote(rdir)} && {warm}"
        f"printf '%s' {shlex.quote(json.dumps(spec, indent=2))} > "
        f"{shlex.quote(f'{rdir}/spec.json')} || exit 4"
        f"{wire}; true",
        warn=True,
    )
    if res.exited == 3:
        raise CellCannotRun(
            f"run.pcap is true but tcpdump is not installed on {host.name}: "
            "install it (Debian package tcpdump) or set run.pcap: false"
        )
    if res.failed:
        raise CellFailed(f"{host.name}: preparing the run failed: {res.stderr.strip()}")
    for name, local in workload.files.items():
        # A plain file name: the file lands in the run directory, nowhere else.
        if "/" in name or name in ("", ".", ".."):
            raise CellCannotRun(f"workload file name {name!r} is not a plain file name")
        host.put(local, f"{rdir}/{name}")
    return "@@wire-ok" in res.stdout


def _build_sampler(host: Host, rdir: str) -> None:
    """Build the native counter sampler on the node if it lacks it (cached after the first
    cell), so the sampler starts sampling at once instead of compiling first."""
    build = "import commscope.node.sampler as s; s.native_binary()"
    res = host.run(
        f"{shlex.quote(host.spec.python)} -c {shlex.quote(build)} "
        f"> {shlex.quote(f'{rdir}/build.log')} 2>&1",
        warn=True,
    )
    if res.failed:
        raise CellFailed(f"{host.name}: building the counter sampler failed (see build.log)")


def _fetch(host: Host, rdir: str, out_dir: Path, shipped: tuple[str, ...] = ()) -> dict[str, Any]:
    """Copy every file of the node's run directory to ``out_dir/<node>/`` (one tar stream over
    one SSH command), but the ``shipped`` inputs, then remove it there; returns the node's
    entry of run.json."""
    if shipped:
        host.run("rm -f " + " ".join(shlex.quote(f"{rdir}/{name}") for name in shipped))
    # Fetch whatever exists, also after a failure: logs explain it, nothing measured is lost.
    host.fetch_tree(rdir, out_dir / host.name)
    return {
        "name": host.name,
        "index": host.spec.index,
        "exp_iface": host.spec.exp_iface,
        "exp_addr": host.spec.exp_addr,
    }
