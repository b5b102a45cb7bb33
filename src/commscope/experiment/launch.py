"""torchrun on every node over SSH: the command line, its environment, launching it on all nodes
at once, and killing what a cell started (by its tag) when a node fails or the cell ends."""

from __future__ import annotations

import logging
import shlex
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from commscope.cluster.hosts import Cluster, Host, on_all
from commscope.spec.settings import CellSettings, RunSettings, Workload

log = logging.getLogger(__name__)

TRAIN_MODULE = "commscope.workload.train"


def training_spec(
    cell: CellSettings, model: Mapping[str, Any], strategy: Mapping[str, Any], run: RunSettings
) -> dict[str, Any]:
    """The run spec ``commscope.workload.train`` reads (the runner adds out_dir and node)."""
    if cell.strategy is None or cell.steps is None or cell.repeat is None:
        raise ValueError(f"a training cell needs strategy, steps and repeat: {cell.as_dict()}")
    return {
        "strategy": cell.strategy,
        "model": dict(model),
        "plan": dict(strategy),
        "steps": int(cell.steps),
        "seed": int(cell.repeat),
        "pg_timeout_s": run.timeout_s,
    }


def training_workload(
    cell: CellSettings, model: Mapping[str, Any], strategy: Mapping[str, Any], run: RunSettings
) -> Workload:
    """The training entry point with the cell's :func:`training_spec`."""
    return Workload(TRAIN_MODULE, training_spec(cell, model, strategy, run))


def new_tag() -> str:
    """A fresh tag to mark every process a cell starts (its command lines carry it)."""
    return f"commscope-{uuid.uuid4().hex[:12]}"


def tag_pattern(tag: str) -> str:
    """``tag`` as a pgrep/pkill pattern, quoted for the shell."""
    # "[c]ommscope-..." matches the tag but not the shell command line that carries the pattern,
    # so pkill never kills the SSH session running it.
    return shlex.quote(f"[{tag[0]}]{tag[1:]}")


def kill_tagged(host: Host, tag: str) -> None:
    """Kill everything this cell started on ``host`` (torchrun, workers, sampler)."""
    pat = tag_pattern(tag)
    # TERM, give up to 2 s to exit, then KILL whatever is left.
    host.run(
        f"pkill -TERM -f {pat} || exit 0; "
        f"for i in $(seq 20); do pgrep -f {pat} >/dev/null || exit 0; sleep 0.1; done; "
        f"pkill -KILL -f {pat}; true",
        warn=True,
    )


@dataclass(frozen=True)
class Torchrun:
    """One cell's torchrun: ``module`` on ``cell.ranks_per_node`` ranks of each of
    ``cell.nodes`` nodes of ``cluster`` (the first node is the rendezvous master)."""

    cluster: Cluster
    cell: CellSettings
    run: RunSettings
    tag: str
    module: str

    def command(self, host: Host, spec: str) -> str:
        """The shell command that starts torchrun on ``host`` with the spec file ``spec``."""
        master = self.cluster.nodes[0]
        n = host.spec
        args = [
            "timeout", "-k", "10", str(int(self.run.timeout_s)),
            n.python, "-m", "torch.distributed.run",
            "--nnodes", str(self.cell.nodes),
            "--nproc-per-node", str(self.cell.ranks_per_node),
            "--node-rank", str(n.index),
            "--master-addr", master.exp_addr,
            "--master-port", str(self.run.master_port),
            "--max-restarts", "0",
            "-m", self.module, spec, "--tag", self.tag,
        ]  # fmt: skip
        return " ".join(shlex.quote(a) for a in args)

    @staticmethod
    def env(host: Host, rdir: str) -> dict[str, str]:
        """The ranks' environment on ``host``: the experiment interface for gloo and NCCL."""
        return {
            "GLOO_SOCKET_IFNAME": host.spec.exp_iface,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            # GPU runs: NCCL's own record of every collective, a second source beside our
            # capture (parsed by commscope.importers.nccl_log). Ignored by gloo.
            "NCCL_SOCKET_IFNAME": host.spec.exp_iface,
            "NCCL_DEBUG": "INFO",
            "NCCL_DEBUG_SUBSYS": "INIT,COLL",
            "NCCL_DEBUG_FILE": f"{rdir}/nccl.%h.%p.log",
        }

    def run_on(self, host: Host, rdir: str) -> tuple[str, int]:
        """Run torchrun on ``host`` in ``rdir`` until it ends: (node name, exit code)."""
        cmd = self.command(host, f"{rdir}/spec.json")
        # The local `timeout` is the backstop if the remote `timeout` cannot fire (node gone).
        res = host.run(
            f"cd {shlex.quote(rdir)} && {cmd} > torchrun.log 2>&1",
            env=self.env(host, rdir),
            warn=True,
            timeout=float(self.run.timeout_s) + 60,
        )
        return host.name, res.exited


def _failure_tail(host: Host, rdir: str) -> str:
    """The end of a failed node's torchrun.log: the workers' own lines first."""
    log_path = f"{rdir}/torchrun.log"
    # The workers' own lines ("[rankN]: ...") say why; the launcher's traceback after them only
    # says that a child failed. Keep both, workers first.
    return host.run(
        f"grep -E '^\\[rank[0-9]+\\]:' {log_path} | tail -n 40; echo ---; tail -n 10 {log_path}",
        warn=True,
    ).stdout


def torchrun_everywhere(
    hosts: list[Host], torchrun: Torchrun, remote_dirs: Mapping[str, str]
) -> list[str]:
    """Start torchrun on all nodes at once; return a description of each node that failed.

    The first node to fail gets every node's processes killed: the others would only wait for
    the lost peer until the gloo timeout."""
    failures = []
    with ThreadPoolExecutor(len(hosts)) as pool:
        futures = {pool.submit(torchrun.run_on, h, remote_dirs[h.name]): h for h in hosts}
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
                failures.append(f"{name}: {reason}\n{_failure_tail(h, remote_dirs[h.name])}")
            on_all(hosts, lambda other: kill_tagged(other, torchrun.tag))
    return failures
