"""Run one sweep cell on the cluster.

Order: shape links → start samplers → torchrun on every node over SSH →
stop samplers → fetch traces over SFTP → always unshape and kill what is left, also when the run
failed or hung. One cell owns the cluster at a time (an fcntl lock on the cluster state dir, on
top of Snakemake's ``cluster_slot`` resource).
"""

from __future__ import annotations

import fcntl
import json
import logging
import shlex
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from commscope.cluster.clock import estimate_offset
from commscope.cluster.hosts import Cluster, Host, on_all
from commscope.config import loss_pct
from commscope.shaping import LinkShape, check_shape_supported, host_has_netem, qdisc_stats, shaped

log = logging.getLogger(__name__)


class CellFailed(RuntimeError):
    """The cell's training did not finish on every node; the message carries the log tails."""


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


def link_shape(cell: dict[str, Any]) -> LinkShape:
    """The tc shape a cell asks for."""
    return LinkShape.parse(cell["bw"], cell["delay"], cell["jitter"], f"{loss_pct(cell['loss'])}%")


TRAIN_MODULE = "commscope.workload.train"


def training_spec(
    cell: dict[str, Any], model: dict[str, Any], strategy: dict[str, Any], run: dict[str, Any]
) -> dict[str, Any]:
    """The run spec ``commscope.workload.train`` reads (the runner adds out_dir and node)."""
    return {
        "strategy": cell["strategy"],
        "model": model,
        "plan": strategy,
        "steps": int(cell["steps"]),
        "seed": int(cell["repeat"]),
        "pg_timeout_s": run["timeout_s"],
    }


def _torchrun_cmd(
    host: Host,
    cluster: Cluster,
    cell: dict[str, Any],
    run: dict[str, Any],
    spec: str,
    tag: str,
    module: str = TRAIN_MODULE,
) -> str:
    master = cluster.nodes[0]
    n = host.spec
    args = [
        "timeout", "-k", "10", str(int(run["timeout_s"])),
        n.python, "-m", "torch.distributed.run",
        "--nnodes", str(cell["nodes"]),
        "--nproc-per-node", str(cell["ranks_per_node"]),
        "--node-rank", str(n.index),
        "--master-addr", master.exp_addr,
        "--master-port", str(run["master_port"]),
        "--max-restarts", "0",
        "-m", module, spec, "--tag", tag,
    ]  # fmt: skip
    return " ".join(shlex.quote(a) for a in args)


def _tag_pattern(tag: str) -> str:
    # "[c]ommscope-..." matches the tag but not the shell command line that carries the pattern,
    # so pkill never kills the SSH session running it.
    return shlex.quote(f"[{tag[0]}]{tag[1:]}")


def _kill_tagged(host: Host, tag: str) -> None:
    """Kill everything this cell started on ``host`` (torchrun, workers, sampler)."""
    pat = _tag_pattern(tag)
    # TERM, give up to 2 s to exit, then KILL whatever is left.
    host.run(
        f"pkill -TERM -f {pat} || exit 0; "
        f"for i in $(seq 20); do pgrep -f {pat} >/dev/null || exit 0; sleep 0.1; done; "
        f"pkill -KILL -f {pat}; true",
        warn=True,
    )


def run_cell(
    cluster: Cluster,
    cell: dict[str, Any],
    model: dict[str, Any],
    strategy: dict[str, Any],
    run: dict[str, Any],
    out_dir: Path,
    *,
    module: str = TRAIN_MODULE,
    spec: dict[str, Any] | None = None,
) -> Path:
    """Run ``cell`` on the first ``cell['nodes']`` nodes; raw traces land in ``out_dir``.

    ``module`` is what torchrun starts on every rank with the path of ``spec`` (default: the
    training entry point and :func:`training_spec`); the cell's ``nodes``, ``ranks_per_node``
    and link axes (bw, delay, jitter, loss) set where it runs and how links are shaped.
    The caller owns the cluster for the duration (see :func:`cluster_lock`)."""
    n_nodes = int(cell["nodes"])
    if n_nodes > cluster.size:
        raise ValueError(
            f"cell wants nodes={n_nodes} but cluster {cluster.name} has {cluster.size}"
        )
    shape = link_shape(cell)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = f"commscope-{uuid.uuid4().hex[:12]}"
    hosts = [
        Host(spec, connect_timeout=float(run.get("connect_timeout_s", 10)))
        for spec in cluster.nodes[:n_nodes]
    ]
    try:
        if shape.needs_netem:
            # Refuse before anything runs: never emulate a delay by silently dropping it.
            check_shape_supported(shape, host_has_netem(hosts[0]))
        if spec is None:
            spec = training_spec(cell, model, strategy, run)
        _run_shaped(hosts, cluster, cell, spec, module, run, shape, tag, out_dir)
    finally:
        try:
            on_all(hosts, lambda h: _kill_tagged(h, tag))
        finally:
            for h in hosts:
                h.close()
    return out_dir


def _run_shaped(
    hosts: list[Host],
    cluster: Cluster,
    cell: dict[str, Any],
    workload_spec: dict[str, Any],
    module: str,
    run: dict[str, Any],
    shape: LinkShape,
    tag: str,
    out_dir: Path,
) -> None:
    remote_dirs = {h.name: f"{h.spec.workdir}/{tag}" for h in hosts}

    socket_hz = float(run.get("socket_hz", 10))
    pcap = bool(run.get("pcap", True))

    def prepare(h: Host) -> None:
        rdir = remote_dirs[h.name]
        spec = {**workload_spec, "out_dir": rdir, "node": h.spec.index}
        local_spec = out_dir / f"spec_{h.name}.json"
        local_spec.write_text(json.dumps(spec, indent=2))
        # Also build the native counter sampler now if this node lacks it (cached after the
        # first cell), so the sampler starts sampling at once instead of compiling first.
        build = "import commscope.sampler as s; s.native_binary()"
        # Exit 3 (before anything starts) when packet capture is asked for but impossible.
        check = "command -v tcpdump >/dev/null || exit 3; " if pcap else ""
        res = h.run(
            f"{check}mkdir -p {shlex.quote(rdir)} && "
            f"{shlex.quote(h.spec.python)} -c {shlex.quote(build)} > {rdir}/build.log 2>&1",
            warn=True,
        )
        if res.exited == 3:
            raise CellFailed(
                f"run.pcap is true but tcpdump is not installed on {h.name}: "
                "install it (Debian package tcpdump) or set run.pcap: false"
            )
        if res.failed:
            raise CellFailed(f"{h.name}: preparing the run failed: {res.stderr.strip()}")
        h.put(local_spec, f"{rdir}/spec.json")
        local_spec.unlink()

    def start_samplers(h: Host) -> tuple[Any, dict[str, Any]]:
        """Start the counter sampler (and socket stats, packet capture when asked) in the
        background: (qdisc stats, first clock sample), see :func:`_beside_clock`."""
        return _beside_clock(h, _start_tools, "start")

    def _start_tools(h: Host) -> None:
        rdir = remote_dirs[h.name]
        py = shlex.quote(h.spec.python)
        limit = float(run["timeout_s"]) + 30
        cmds = [
            f"{py} -m commscope.sampler --iface {h.spec.exp_iface} --hz {int(run['sample_hz'])} "
            f"--out {rdir}/counters.parquet --max-seconds {limit} --tag {tag} > sampler.log 2>&1"
        ]
        if socket_hz > 0:
            cmds.append(
                f"{py} -m commscope.sockstats --addr {h.spec.exp_addr} --hz {socket_hz} "
                f"--out {rdir}/sockets.parquet --max-seconds {limit} --tag {tag} "
                "> sockstats.log 2>&1"
            )
        if pcap:
            # -Z root: write as root (tcpdump otherwise drops to user tcpdump after opening).
            # The file name carries the tag, so the stop step can find this tcpdump.
            cmds.append(
                f"timeout {int(limit)} tcpdump -i {h.spec.exp_iface} -s 96 -n -Z root "
                f"--time-stamp-precision=nano -w {rdir}/{tag}.pcap > tcpdump.log 2>&1"
            )
        # Background only the tools: `a && b &` would background a subshell that keeps the SSH
        # channel's stdout open, and the call would block until the tools exit.
        start = " ".join(f"(nohup setsid {c} < /dev/null &);" for c in cmds)
        # Capture must be running before training starts, or first packets are lost.
        ready = (
            f" for i in $(seq 50); do grep -q 'listening on' {rdir}/tcpdump.log && exit 0; "
            f"sleep 0.1; done; echo 'tcpdump did not start:' >&2; cat {rdir}/tcpdump.log >&2;"
            " exit 1"
            if pcap
            else ""
        )
        h.run(f"cd {rdir} && {start}{ready}")

    def stop_samplers(h: Host) -> tuple[Any, dict[str, Any]]:
        """Stop the background tools: (qdisc stats, last clock sample)."""
        return _beside_clock(h, _stop_tools, "end")

    def _stop_tools(h: Host) -> None:
        rdir = remote_dirs[h.name]
        outputs = [f"{rdir}/counters.parquet"]
        patterns = [f"{_tag_pattern('commscope.sampler')}.*{tag}"]
        if socket_hz > 0:
            outputs.append(f"{rdir}/sockets.parquet")
            patterns.append(f"{_tag_pattern('commscope.sockstats')}.*{tag}")
        if pcap:
            patterns.append(f"{_tag_pattern('tcpdump')}.*{tag}")
        waits = " && ".join(f"test -e {o}" for o in outputs)
        # One round trip: signal, then wait (up to 20 s) for the atomically renamed outputs
        # and for tcpdump to flush and exit.
        # Headers of a capped run are ~100 B per 1.5 KB frame; gzip takes them to a fraction
        # before they cross SSH (training is over: the CPU is free).
        pack = f"; gzip -1 -f {rdir}/{tag}.pcap" if pcap else ""
        h.run(
            "; ".join(f"pkill -TERM -f {pat}" for pat in patterns) + "; "
            f"for i in $(seq 200); do {waits} && ! pgrep -f {patterns[-1]} >/dev/null "
            f"&& break; sleep 0.1; done; {waits} || echo 'sampler output missing' >&2{pack}",
            warn=True,
        )

    def fetch(h: Host) -> dict[str, Any]:
        # Fetch whatever exists, also after a failure: logs explain it, nothing measured is lost.
        rdir = remote_dirs[h.name]
        for name in h.run(f"ls -1 {shlex.quote(rdir)}", warn=True).stdout.split():
            h.get(f"{rdir}/{name}", out_dir / h.name / name)
        h.run(f"rm -rf {shlex.quote(rdir)}", warn=True)
        return {
            "name": h.name,
            "index": h.spec.index,
            "exp_iface": h.spec.exp_iface,
            "exp_addr": h.spec.exp_addr,
        }

    on_all(hosts, prepare)
    log.info("prepared %d nodes", len(hosts))
    meta: dict[str, Any] = {
        "tag": tag,
        "shape": shape.__dict__,
        "captures": {"sample_hz": int(run["sample_hz"]), "socket_hz": socket_hz, "pcap": pcap},
    }
    names = [h.name for h in hosts]
    with shaped(hosts, shape):
        started = on_all(hosts, start_samplers)
        meta["qdisc_before"] = {n: q for n, (q, _) in zip(names, started, strict=True)}
        clock_start = [c for _, c in started]
        log.info("links shaped (%s), samplers started, clocks probed", shape)
        meta["t_start_ns"] = time.time_ns()
        failures = _torchrun_everywhere(hosts, cluster, cell, run, remote_dirs, tag, module)
        log.info("torchrun ended on every node (%d failed)", len(failures))
        meta["t_end_ns"] = time.time_ns()
        stopped = on_all(hosts, stop_samplers)
        meta["qdisc_after"] = {n: q for n, (q, _) in zip(names, stopped, strict=True)}
        clock_end = [c for _, c in stopped]
    meta["clock"] = {
        # netns nodes read the host kernel's clock: the estimates only check the method.
        "applied": cluster.backend != "netns",
        "nodes": {n: {**a, **b} for n, a, b in zip(names, clock_start, clock_end, strict=True)},
    }
    log.info("samplers stopped, links unshaped")
    meta["nodes"] = on_all(hosts, fetch)
    log.info("fetched every node's files")
    (out_dir / "run.json").write_text(json.dumps(meta, indent=2, default=str))
    if failures:
        raise CellFailed("training failed on " + "; ".join(failures))


def _beside_clock(h: Host, work: Callable[[Host], None], when: str) -> tuple[Any, dict[str, Any]]:
    """Take ``h``'s qdisc statistics and do ``work`` on it while, on a second SSH channel,
    estimating its clock offset: saves the probe's round trips on every cell. Returns
    (qdisc stats, ``{when: clock sample}``)."""
    with ThreadPoolExecutor(1) as pool:
        clock = pool.submit(estimate_offset, h)
        stats = qdisc_stats(h)
        work(h)
        return stats, {when: clock.result().as_dict()}


def _torchrun_everywhere(
    hosts: list[Host],
    cluster: Cluster,
    cell: dict[str, Any],
    run: dict[str, Any],
    remote_dirs: dict[str, str],
    tag: str,
    module: str,
) -> list[str]:
    """Start torchrun on all nodes at once; return a description of each node that failed."""

    def launch(h: Host) -> tuple[str, int]:
        rdir = remote_dirs[h.name]
        cmd = _torchrun_cmd(h, cluster, cell, run, f"{rdir}/spec.json", tag, module)
        env = {
            "GLOO_SOCKET_IFNAME": h.spec.exp_iface,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            # GPU runs: NCCL's own record of every collective, a second source beside our
            # capture (parsed by commscope.importers.nccl_log). Ignored by gloo.
            "NCCL_SOCKET_IFNAME": h.spec.exp_iface,
            "NCCL_DEBUG": "INFO",
            "NCCL_DEBUG_SUBSYS": "INIT,COLL",
            "NCCL_DEBUG_FILE": f"{rdir}/nccl.%h.%p.log",
        }
        # The local `timeout` is the backstop if the remote `timeout` cannot fire (node gone).
        res = h.run(
            f"cd {shlex.quote(rdir)} && {cmd} > torchrun.log 2>&1",
            env=env,
            warn=True,
            timeout=float(run["timeout_s"]) + 60,
        )
        return h.name, res.exited

    failures = []
    with ThreadPoolExecutor(len(hosts)) as pool:
        futures = {pool.submit(launch, h): h for h in hosts}
        for fut in as_completed(futures):
            h = futures[fut]
            try:
                name, code = fut.result()
            except Exception as err:  # command timeout or SSH failure
                name, code = h.name, None
                failures.append(f"{h.name}: {type(err).__name__}: {err}")
            if code == 0:
                continue
            if code is not None:
                reason = "timed out" if code in (124, 137) else f"exit {code}"
                # The workers' own lines ("[rankN]: ...") say why; the launcher's traceback
                # after them only says that a child failed. Keep both, workers first.
                log_path = f"{remote_dirs[h.name]}/torchrun.log"
                tail = h.run(
                    f"grep -E '^\\[rank[0-9]+\\]:' {log_path} | tail -n 40; echo ---; "
                    f"tail -n 10 {log_path}",
                    warn=True,
                ).stdout
                failures.append(f"{name}: {reason}\n{tail}")
            # The other nodes would only wait for the lost peer until the gloo timeout.
            on_all(hosts, lambda other: _kill_tagged(other, tag))
    return failures


def provision_and_run(
    cluster_cfg: dict[str, Any],
    cell: dict[str, Any],
    model: dict[str, Any],
    strategy: dict[str, Any],
    run: dict[str, Any],
    out_dir: Path,
    root: Path | None = None,
    *,
    module: str = TRAIN_MODULE,
    spec: dict[str, Any] | None = None,
) -> Path:
    """Make sure the cluster is up with enough nodes (idempotent), then run the cell on it
    (``module`` and ``spec`` as in :func:`run_cell`)."""
    from commscope.cluster.provision import provision, state_dir

    root = root or Path.cwd()
    with cluster_lock(state_dir(cluster_cfg, root)):
        cluster = provision(cluster_cfg, int(cell["nodes"]), root)
        log.info(
            "cell %s on %s cluster %s (%d nodes)", cell, cluster.backend, cluster.name, cluster.size
        )
        run = {**run, "connect_timeout_s": cluster_cfg.get("connect_timeout_s", 10)}
        return run_cell(cluster, cell, model, strategy, run, out_dir, module=module, spec=spec)
