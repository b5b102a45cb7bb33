"""What node 0 exposes while a cell's ranks run (issue 15, item 5): the rendezvous store listens
on node 0's experiment address only, under both launchers, and the cell still trains."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from commscope.cluster.hosts import Cluster
from commscope.cluster.teardown import ns_name
from commscope.experiment.cell import CellFailed, run_cell
from commscope.experiment.launch import training_workload
from commscope.spec.plan import BUILTIN_STRATEGIES
from commscope.spec.settings import CellSettings, RunSettings

pytestmark = pytest.mark.integration

MODEL = {"layers": 2, "hidden": 32, "heads": 2, "seq": 16, "vocab": 64, "batch": 4}
PORT = 29533  # not test_runner's 29531: a listener found here is this test's cell's


def _in_ns(cluster: Cluster, node: int, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns_name(cluster.name, node), *cmd],
        capture_output=True,
        text=True,
        timeout=30,
    )


def _listeners(cluster: Cluster, node: int) -> list[tuple[str, str]]:
    """(local address:port, process) of every TCP socket listening on ``node``."""
    out = _in_ns(cluster, node, "ss", "-ltnpH").stdout
    return [(line.split()[3], line.split()[-1]) for line in out.splitlines() if line.split()]


def _connects(cluster: Cluster, node: int, addr: str, port: int) -> str:
    """What a TCP connect from inside ``node`` to ``addr``:``port`` gets: ok, refused or
    timeout."""
    probe = (
        "import socket,sys\n"
        "try:\n"
        "    socket.create_connection((sys.argv[1], int(sys.argv[2])), 2).close(); print('ok')\n"
        "except ConnectionRefusedError:\n"
        "    print('refused')\n"
        "except OSError:\n"
        "    print('timeout')\n"
    )
    node_python = cluster.nodes[node].python
    return _in_ns(cluster, node, node_python, "-c", probe, addr, str(port)).stdout.strip()


def _kill_ranks(cluster: Cluster) -> None:
    """End the cell: SIGKILL node 1's training processes (forked ranks, torchrun's workers)."""
    pids = subprocess.run(
        ["ip", "netns", "pids", ns_name(cluster.name, 1)], capture_output=True, text=True
    ).stdout.split()
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            parent = Path(f"/proc/{stat[1]}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        forked_rank = "commscope.node.forkserver\0serve" in parent
        if forked_rank or "torch.distributed.run" in cmdline:
            subprocess.run(["kill", "-KILL", pid], check=False)


@pytest.mark.parametrize("launcher", ["warm", "torchrun"])
def test_the_store_listens_on_the_experiment_address_only(
    netns_cluster: Cluster, tmp_path: Path, launcher: str
) -> None:
    """While a 2-node DDP cell trains: node 0's store port listens on its experiment address and
    nowhere else; node 0's management address refuses it (nothing there, not just the
    management firewall dropping it), the host cannot reach it, node 1 reaches it over the
    experiment network."""
    node0 = netns_cluster.nodes[0]
    cell = CellSettings.from_mapping(
        {
            "strategy": "ddp", "model": "tiny", "nodes": 2, "ranks_per_node": 1, "bw": "none",
            "delay": "0ms", "jitter": "0ms", "loss": "0pct", "steps": 100000, "repeat": 0,
        }
    )  # fmt: skip
    run = RunSettings.from_mapping(
        {"timeout_s": 90, "sample_hz": 50, "master_port": PORT, "launcher": launcher}
    )
    workload = training_workload(cell, MODEL, BUILTIN_STRATEGIES["ddp"], run)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            run_cell(netns_cluster, cell, workload, run, tmp_path)
        except BaseException as err:  # handed to the test thread
            errors.append(err)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        # Until the store listens and node 1's rank is connected to it (the ranks are joining).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and thread.is_alive():
            listening = [a for a, _ in _listeners(netns_cluster, 0) if a.endswith(f":{PORT}")]
            established = _in_ns(netns_cluster, 1, "ss", "-tnH", f"dport = :{PORT}").stdout
            if listening and established.strip():
                break
            time.sleep(0.2)
        listeners = _listeners(netns_cluster, 0)
        print(f"{launcher}: node 0 listens on:\n" + "\n".join(f"  {a} {p}" for a, p in listeners))
        store = [addr for addr, _ in listeners if addr.endswith(f":{PORT}")]
        assert store == [f"{node0.exp_addr}:{PORT}"], listeners
        assert _connects(netns_cluster, 0, node0.ssh_host, PORT) == "refused"
        assert _connects(netns_cluster, 1, node0.exp_addr, PORT) == "ok"
        with pytest.raises(OSError):  # dropped on the way in (management firewall) or refused
            socket.create_connection((node0.ssh_host, PORT), timeout=1.5).close()
        # Everything else (gloo's pairs once they listen) is on the experiment address too.
        others = [a for a, p in listeners if "sshd" not in p and not a.endswith(f":{PORT}")]
        print(f"{launcher}: other listeners: {others}")
        assert all(a.startswith(f"{node0.exp_addr}:") for a in others), listeners
    finally:
        _kill_ranks(netns_cluster)
        thread.join(timeout=120)
    assert not thread.is_alive(), "the cell did not end after its ranks were killed"
    assert errors and isinstance(errors[0], CellFailed), errors


@pytest.mark.parametrize("launcher", ["warm", "torchrun"])
def test_a_cell_trains_with_the_bound_store(
    netns_cluster: Cluster, tmp_path: Path, launcher: str
) -> None:
    """2 nodes x 2 ranks train to the end with the store bound: node 0's second rank and node
    1's ranks reach it as clients; only rank 0 (or torchrun's agent) binds it."""
    cell = CellSettings.from_mapping(
        {
            "strategy": "ddp", "model": "tiny", "nodes": 2, "ranks_per_node": 2, "bw": "none",
            "delay": "0ms", "jitter": "0ms", "loss": "0pct", "steps": 2, "repeat": 0,
        }
    )  # fmt: skip
    run = RunSettings.from_mapping(
        {"timeout_s": 90, "sample_hz": 50, "master_port": PORT, "launcher": launcher}
    )
    workload = training_workload(cell, MODEL, BUILTIN_STRATEGIES["ddp"], run)
    started = time.monotonic()
    raw = run_cell(netns_cluster, cell, workload, run, tmp_path)
    print(f"{launcher}: 2x2 cell trained in {time.monotonic() - started:.1f} s")
    assert sorted(p.name for p in raw.rglob("rank*.json")) == [f"rank{r}.json" for r in range(4)]
