"""The ranks on every node over SSH: the launcher's command line (the warm fork server of
:mod:`commscope.node.forkserver`, or torchrun), its environment, launching it on all nodes at
once, and killing what a cell started (by its tag) when a node fails or the cell ends."""

from __future__ import annotations

import logging
import shlex
import signal
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from commscope.cluster.hosts import Cluster, Host, on_all
from commscope.spec.settings import CellSettings, RunSettings, Workload

log = logging.getLogger(__name__)

TRAIN_MODULE = "commscope.workload.train"
FORKSERVER_MODULE = "commscope.node.forkserver"
# Node 0's ranks (or torchrun) run under it: it binds the rendezvous store to the experiment
# address before the rendezvous would open it on every address (see that module).
RENDEZVOUS_MODULE = "commscope.workload.rendezvous"
# What a node's launcher prints (the fork server's client, or torchrun and its workers).
LAUNCH_LOG = "launch.log"


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
        # After the traces are written: one socket-sampler period and a half (train.py).
        "linger_s": 1.5 / run.socket_hz if run.socket_hz > 0 else 0.0,
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


def kill_everywhere(hosts: list[Host], tag: str) -> list[str]:
    """:func:`kill_tagged` on every host; never raises: a node that cannot be reached (its sshd
    gone, its link down) is returned as ``"NODE: why"``, so the other nodes are still cleaned
    and the cell's own failure is what the user sees."""

    def kill(host: Host) -> str:
        try:
            kill_tagged(host, tag)
            return ""
        except Exception as err:
            return f"{host.name}: could not kill the cell's processes ({type(err).__name__}: {err})"

    return [why for why in on_all(hosts, kill) if why]


def forkserver_log(host: Host) -> str:
    """Where a node's fork server logs: beside the cells' run directories (it outlives them)."""
    return f"{host.spec.workdir}/forkserver.log"


def ensure_forkserver(host: Host, module: str) -> str:
    """A shell step that starts ``host``'s fork server for ``module`` in the background if none
    runs (so its imports overlap the cell's shaping), with the ranks' import-time environment."""
    py = shlex.quote(host.spec.python)
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in Launcher.import_env().items())
    return (
        f"(env {env} nohup setsid {py} -m {FORKSERVER_MODULE} ensure "
        f"--preload {shlex.quote(module)} "
        f"--server-log {shlex.quote(forkserver_log(host))} < /dev/null > /dev/null 2>&1 &)"
    )


@dataclass(frozen=True)
class Launcher:
    """One cell's ranks: ``module`` on ``cell.ranks_per_node`` ranks of each of ``cell.nodes``
    nodes of ``cluster`` (the first node is the rendezvous master), started by
    ``run.launcher``: forked by the node's warm fork server, or by torchrun."""

    cluster: Cluster
    cell: CellSettings
    run: RunSettings
    tag: str
    module: str

    def command(self, host: Host, spec: str) -> str:
        """The shell command that starts this node's ranks on ``host`` with the spec file
        ``spec``; the cell's tag is on its command line (what :func:`kill_tagged` finds)."""
        master = self.cluster.nodes[0]
        n = host.spec
        common = [
            "--nnodes", str(self.cell.nodes),
            "--node-rank", str(n.index),
            "--master-addr", master.exp_addr,
            "--master-port", str(self.run.master_port),
        ]  # fmt: skip
        # On node 0, the process that hosts the store (rank 0; torchrun's agent) binds it to
        # the experiment address first.
        bind = ["--bind", f"{master.exp_addr}:{self.run.master_port}"]
        if self.run.launcher == "warm":
            module = [self.module, "--"]
            if n.index == 0:
                module = [RENDEZVOUS_MODULE, "--", *bind, self.module]
            launcher = [
                n.python, "-m", FORKSERVER_MODULE, "launch",
                "--preload", self.module, "--server-log", forkserver_log(host),
                "--nproc", str(self.cell.ranks_per_node), *common, "--module", *module,
            ]  # fmt: skip
        else:
            run = ["-m", "torch.distributed.run"]
            if n.index == 0:
                run = ["-m", RENDEZVOUS_MODULE, *bind, "torch.distributed.run"]
            launcher = [
                n.python, *run,
                "--nproc-per-node", str(self.cell.ranks_per_node), *common,
                "--max-restarts", "0", "-m", self.module,
            ]  # fmt: skip
        timeout = ["timeout", "-k", "10", str(int(self.run.timeout_s))]
        return " ".join(shlex.quote(a) for a in [*timeout, *launcher, spec, "--tag", self.tag])

    @staticmethod
    def import_env() -> dict[str, str]:
        """The part of the ranks' environment read when torch is imported (thread pools)."""
        return {"OMP_NUM_THREADS": "1"}

    @staticmethod
    def env(host: Host, rdir: str) -> dict[str, str]:
        """The ranks' environment on ``host``: the experiment interface for gloo and NCCL."""
        return {
            **Launcher.import_env(),
            "GLOO_SOCKET_IFNAME": host.spec.exp_iface,
            "PYTHONUNBUFFERED": "1",
            # GPU runs: NCCL's own record of every collective, a second source beside our
            # capture (parsed by commscope.importers.nccl_log). Ignored by gloo.
            "NCCL_SOCKET_IFNAME": host.spec.exp_iface,
            "NCCL_DEBUG": "INFO",
            "NCCL_DEBUG_SUBSYS": "INIT,COLL",
            "NCCL_DEBUG_FILE": f"{rdir}/nccl.%h.%p.log",
        }

    def run_on(self, host: Host, rdir: str) -> tuple[str, int]:
        """Run this node's ranks on ``host`` in ``rdir`` until they end: (node name, exit code)."""
        cmd = self.command(host, f"{rdir}/spec.json")
        # The local `timeout` is the backstop if the remote `timeout` cannot fire (node gone).
        res = host.run(
            f"cd {shlex.quote(rdir)} && {cmd} > {LAUNCH_LOG} 2>&1",
            env=self.env(host, rdir),
            warn=True,
            timeout=float(self.run.timeout_s) + 60,
        )
        return host.name, res.exited


# Free space under which a failed node's workdir is reported as the likely cause.
DISK_LOW_KB = 1024


def _failure_tail(host: Host, rdir: str) -> str:
    """The end of a failed node's logs: the ranks' own lines first (rank{R}.log under the warm
    launcher, "[rankN]: ..." lines of torchrun's log), then the launcher's."""
    # The ranks' lines say why; the launcher's after them only says that a rank failed. A full
    # disk comes first: it can leave the ranks' logs empty, so nothing else would say it.
    return host.run(
        f"cd {shlex.quote(rdir)} && df -Pk . | awk 'NR == 2 && $4 < {DISK_LOW_KB} "
        f'{{ print "No space left on device: " $6 " has " $4 " KB free, in the cell workdir" }}\'; '
        f'for f in rank*.log; do test -e "$f" && '
        f'{{ echo "== $f"; tail -n 20 "$f"; }}; done; '
        f"grep -E '^\\[rank[0-9]+\\]:' {LAUNCH_LOG} | tail -n 40; echo ---; "
        f"tail -n 10 {LAUNCH_LOG}",
        warn=True,
    ).stdout


def exit_reason(code: int, timeout_s: float, elapsed_s: float) -> str:
    """A node's launch exit code in words. 124 is ``timeout``'s TERM; 137 (128 + SIGKILL) is
    either its KILL after the grace or a rank killed by a signal, told apart by when it came:
    before ``timeout_s`` nothing timed out. Other codes above 128 name their signal."""
    if code == 124 or (code == 137 and elapsed_s >= timeout_s):
        return f"timed out (run.timeout_s={timeout_s:g})"
    if code > 128:
        try:
            return f"exit {code}: a rank was killed by {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"exit {code}"


def launch_everywhere(
    hosts: list[Host], launcher: Launcher, remote_dirs: Mapping[str, str]
) -> list[str]:
    """Start the ranks on all nodes at once; return a description of each node that failed.

    The first node to fail gets every node's processes killed: the others would only wait for
    the lost peer until the gloo timeout."""
    failures = []
    started = time.monotonic()
    with ThreadPoolExecutor(len(hosts)) as pool:
        futures = {pool.submit(launcher.run_on, h, remote_dirs[h.name]): h for h in hosts}
        try:
            _collect(futures, hosts, launcher, remote_dirs, started, failures)
        except BaseException:
            # Interrupted (SIGTERM, Ctrl-C): end the ranks everywhere first, so the threads
            # still waiting on them return and leaving this block does not wait out the run.
            kill_everywhere(hosts, launcher.tag)
            raise
    return failures


def _collect(
    futures: Mapping[Any, Host],
    hosts: list[Host],
    launcher: Launcher,
    remote_dirs: Mapping[str, str],
    started: float,
    failures: list[str],
) -> None:
    """Wait for every node's ranks; on the first failure kill every node's processes."""
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
            reason = exit_reason(code, launcher.run.timeout_s, time.monotonic() - started)
            failures.append(f"{name}: {reason}\n{_failure_tail(h, remote_dirs[h.name])}")
        for why in kill_everywhere(hosts, launcher.tag):
            log.warning("%s", why)
