"""run_cell on a real 2-node cluster: a good cell, a hybrid cell on 2 ranks per node, a hung
cell, a cell with a crashing rank."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from commscope.cell.parse import build_cell_tables, cell_table_paths
from commscope.cluster.hosts import Cluster
from commscope.cluster.shaping import qdisc_snapshot
from commscope.cluster.teardown import ns_name
from commscope.contracts import NODE_HOST_FILE
from commscope.experiment.cell import CellFailed, run_cell
from commscope.experiment.launch import training_workload
from commscope.spec.plan import BUILTIN_STRATEGIES, ParallelPlan
from commscope.spec.settings import CellSettings, RunSettings

pytestmark = pytest.mark.integration

MODEL = {"layers": 2, "hidden": 32, "heads": 2, "seq": 16, "vocab": 64, "batch": 4}
# Pipeline and bucket settings belong to the strategy now; run: keeps timing and sampling.
RUN = {"timeout_s": 60, "sample_hz": 200, "master_port": 29531}
DDP = BUILTIN_STRATEGIES["ddp"]


def cell(**overrides: object) -> dict:
    base = {
        "strategy": "ddp",
        "model": "tiny",
        "nodes": 2,
        "ranks_per_node": 1,
        "bw": "100mbit",
        "delay": "0ms",
        "jitter": "0ms",
        "loss": "0pct",
        "steps": 2,
        "repeat": 0,
    }
    return base | overrides


def run_training(
    cluster: Cluster, cell_values: dict, model: dict, strategy: dict, run_values: dict, out: Path
) -> Path:
    """run_cell with the training workload, settings built as the run_cell script builds them."""
    cell_settings = CellSettings.from_mapping(cell_values)
    run = RunSettings.from_mapping(run_values)
    workload = training_workload(cell_settings, model, strategy, run)
    return run_cell(cluster, cell_settings, workload, run, out)


def leftover_processes(cluster: Cluster) -> str:
    """commscope processes a cell on ``cluster`` left behind (a study running on another
    cluster at the same time is not ours to judge: its work directories differ)."""
    out = subprocess.run(
        ["pgrep", "-af", "[c]ommscope.(workload|node)|[t]cpdump"],
        capture_output=True,
        text=True,
    )
    workdirs = [node.workdir for node in cluster.nodes]
    left = "".join(
        line + "\n" for line in out.stdout.splitlines() if any(f"{w}/" in line for w in workdirs)
    )
    # Ranks forked by a node's warm fork server carry the server's command line, not the cell's
    # tag: on this cluster's nodes, a child of a fork server is a rank left behind. (The server
    # itself stays between cells on purpose.)
    for i in range(cluster.size):
        pids = subprocess.run(
            ["ip", "netns", "pids", ns_name(cluster.name, i)], capture_output=True, text=True
        ).stdout.split()
        for pid in pids:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
                parent = Path(f"/proc/{ppid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue  # ended while we looked
            if "commscope.node.forkserver\0serve" in parent:
                left += f"{pid} (rank forked by fork server {ppid}) {cmd}\n"
    return left


def assert_clean(cluster: Cluster) -> None:
    for host in cluster.hosts():
        with host:
            snap = qdisc_snapshot(host)
        assert all(line.endswith(": default") for line in snap.splitlines()), snap
    assert leftover_processes(cluster) == ""


def test_cell_runs_and_fetches_every_nodes_traces(netns_cluster: Cluster, tmp_path: Path) -> None:
    out = run_training(netns_cluster, cell(), MODEL, DDP, RUN, tmp_path / "raw")
    for index, node in enumerate(("node0", "node1")):
        files = {p.name for p in (out / node).iterdir()}
        assert {"wire.parquet", "wire.json", "launch.log", f"rank{index}.log", "spec.json"} <= files
        # The in-kernel accounting ran (the default) and counted every byte and packet the
        # interface counted while it was attached, to the byte, in both directions.
        wire = json.loads((out / node / "wire.json").read_text())
        count = {
            k: wire["counters_end"][k] - wire["counters_start"][k] for k in wire["counters_end"]
        }
        # Between the counters read while attached and those read around the attach and the
        # detach: an ARP probe once crossed in the instant between an attach and its read.
        outer = wire["counters_outer"]
        wide = {
            k: outer["after_detach"][k] - outer["before_attach"][k] for k in wire["counters_end"]
        }
        for field in ("bytes", "packets"):
            assert count[f"rx_{field}"] <= wire["totals"]["ingress"][field] <= wide[f"rx_{field}"]
        # Egress is counted before the sender's tbf: equal unless the tbf dropped.
        meta = json.loads((out / "run.json").read_text())
        drops = sum(q["drops"] for q in meta["qdisc_after"][node] if q["dev"] == "exp0")
        egress = {"bytes": count["tx_bytes"], "packets": count["tx_packets"]}
        if drops == 0 and count["tx_dropped"] == 0:
            assert wire["totals"]["egress"] == egress
        assert wire["totals"]["egress"]["bytes"] >= egress["bytes"]
        assert wire["overruns"] == {"ingress": 0, "egress": 0}
        assert any(f.startswith("ops_rank") for f in files)
        # The fidelity monitor ran beside the ranks and saw them run (docs/fidelity.md).
        host = pd.read_parquet(out / node / NODE_HOST_FILE)
        assert len(host) >= 2 and host["cpu_total_ns"].is_monotonic_increasing
        assert host["ranks_run_ns"].iloc[-1] > max(host["ranks_run_ns"].iloc[0], 0)
        assert host["ranks_threads"].max() >= 1
        # The spec carries the model and the strategy's definition; each rank records the plan
        # resolved for the cell's world (2 nodes x 1 rank: dp=2).
        spec = json.loads((out / node / "spec.json").read_text())
        assert spec["plan"] == DDP and spec["model"] == MODEL
        rank_meta = json.loads((out / node / f"rank{index}.json").read_text())
        assert ParallelPlan(**rank_meta["plan"]) == ParallelPlan(dp=2)
        assert rank_meta["node"] == index
    meta = json.loads((out / "run.json").read_text())
    assert meta["shape"]["rate_bps"] == 100_000_000
    assert meta["wire"] == {"source": "bpf", "bin_ns": 100_000, "reason": None, "requested": "bpf"}
    # The qdisc statistics taken while shaped show the tbf on both nodes.
    kinds = {q["kind"] for stats in meta["qdisc_after"].values() for q in stats}
    assert "tbf" in kinds
    tables = build_cell_tables(
        out, CellSettings.from_mapping(cell()), 1, cell_table_paths(tmp_path / "trace")
    )
    counters = pd.read_parquet(tables["counters"])
    assert set(counters["resolution_ns"]) == {100_000}
    flows = pd.read_parquet(tables["wire_flows"])
    for node in (0, 1):
        c = counters[counters.node == node].sort_values("t_ns")
        assert c.tx_bytes.is_monotonic_increasing and c.rx_bytes.is_monotonic_increasing
        # What the node received from its peer is its whole rx but ARP and the like.
        received = int(flows[flows.dst_node == node].bytes.sum())
        assert 0.99 * c.rx_bytes.iloc[-1] <= received <= c.rx_bytes.iloc[-1]
    assert_clean(netns_cluster)


def test_cell_falls_back_to_the_sampler_and_says_why(
    netns_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without clang on the orchestrator the BPF program cannot be built: the cell still runs,
    with the /proc sampler and tcpdump, and run.json says why."""
    monkeypatch.setenv("BPF_CLANG", "/nonexistent/clang")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no object built before
    out = run_training(netns_cluster, cell(steps=2), MODEL, DDP, RUN, tmp_path / "raw")
    meta = json.loads((out / "run.json").read_text())
    assert meta["wire"]["source"] == "counters" and meta["wire"]["requested"] == "bpf"
    assert "/nonexistent/clang not found on the orchestrator" in meta["wire"]["reason"]
    for node in ("node0", "node1"):
        files = {p.name for p in (out / node).iterdir()}
        assert "counters.parquet" in files and "wire.parquet" not in files
        assert any(f.endswith(".pcap.gz") for f in files)  # the matrix comes from the capture
    assert_clean(netns_cluster)


def test_cell_records_sockets_packets_and_clock(netns_cluster: Cluster, tmp_path: Path) -> None:
    """The system-level side channels of the counters source: socket stats, packet headers,
    clock offsets, all turned into per-cell tables that agree with the counters."""
    run = RUN | {"socket_hz": 20, "wire": "counters"}
    out = run_training(netns_cluster, cell(bw="none", steps=3), MODEL, DDP, run, tmp_path / "raw")
    meta = json.loads((out / "run.json").read_text())
    expect = {"wire": "counters", "sample_hz": 200, "socket_hz": 20, "pcap": True}
    assert meta["captures"] == expect
    # netns nodes share the host clock: the estimates must say ~0 within their own bound.
    assert meta["clock"]["applied"] is False
    for sample in meta["clock"]["nodes"].values():
        for when in ("start", "end"):
            s = sample[when]
            assert abs(s["offset_ns"]) <= s["uncertainty_ns"] + 1_000_000, s
    tables = build_cell_tables(
        out,
        CellSettings.from_mapping(cell(bw="none", steps=3)),
        1,
        cell_table_paths(tmp_path / "trace"),
    )
    sockets = pd.read_parquet(tables["sockets"])
    assert set(sockets.node) == {0, 1}
    # gloo's connections between the two ranks carried the gradients (3 steps of a ~120 kB
    # all-reduce each way): the kernel acknowledged at least that much.
    acked = sockets.groupby(["node", "src", "sport", "dst", "dport"]).bytes_acked.max()
    assert acked.groupby(level="node").sum().min() > 3 * 100_000
    assert (sockets.rtt_us > 0).all()
    flows = pd.read_parquet(tables["wire_flows"])
    assert set(zip(flows.src_node, flows.dst_node, strict=True)) == {(0, 1), (1, 0)}
    # Every packet a node sent to the other is one it counted as tx: within the counters'
    # total over the run (which also has ARP and the like), and most of it.
    counters = pd.read_parquet(tables["counters"])
    for node in (0, 1):
        c = counters[counters.node == node]
        tx = int(c.tx_bytes.max() - c.tx_bytes.min())
        sent = int(flows[flows.src_node == node].bytes.sum())
        assert 0.97 * tx <= sent <= tx, (node, sent, tx)
    assert pd.read_parquet(tables["nccl_ops"]).empty  # gloo: no NCCL log
    assert_clean(netns_cluster)


def test_hung_cell_is_killed_everywhere_and_fails_cleanly(
    netns_cluster: Cluster, tmp_path: Path
) -> None:
    # 1 kbit/s cannot carry DDP's first gradient bucket in 4 s: the run hangs in all-reduce.
    with pytest.raises(CellFailed, match="timed out"):
        run_training(
            netns_cluster,
            cell(bw="8kbit", steps=50),
            MODEL,
            DDP,
            RUN | {"timeout_s": 4},
            tmp_path,
        )
    assert_clean(netns_cluster)
    # What was measured before the kill is still fetched (logs, counters).
    assert (tmp_path / "node0" / "launch.log").exists()


def test_crashing_rank_fails_the_cell_fast(netns_cluster: Cluster, tmp_path: Path) -> None:
    # One head split over 2 tensor-parallel ranks: each holds half a head and the attention
    # reshape raises in the first forward (check_study would refuse this config up front).
    bad_model = MODEL | {"heads": 1}
    with pytest.raises(CellFailed, match="exit"):
        run_training(
            netns_cluster, cell(strategy="tp"), bad_model, BUILTIN_STRATEGIES["tp"], RUN, tmp_path
        )
    assert_clean(netns_cluster)


def _rank_pids(cluster: Cluster, node: int) -> list[int]:
    """The ranks running on ``node``: children of its fork server (the warm launcher)."""
    out = subprocess.run(
        ["ip", "netns", "pids", ns_name(cluster.name, node)], capture_output=True, text=True
    ).stdout.split()
    ranks = []
    for pid in map(int, out):
        try:
            ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            parent = Path(f"/proc/{ppid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "commscope.node.forkserver\0serve" in parent:
            ranks.append(pid)
    return ranks


def _fault_mid_cell(cluster: Cluster, out: Path, fault: Any, **run: object) -> tuple[str, float]:
    """Run a long DDP cell, inject ``fault`` once node 1's rank has trained for a second, and
    return the cell's failure message and the seconds from the fault to the failure."""
    errors: list[BaseException] = []
    ended = threading.Event()

    def work() -> None:
        try:
            run_training(cluster, cell(steps=100000, bw="none"), MODEL, DDP, RUN | run, out)
        except BaseException as err:  # handed to the test thread
            errors.append(err)
        finally:
            ended.set()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not _rank_pids(cluster, 1) and time.monotonic() < deadline and not ended.is_set():
        time.sleep(0.1)
    assert _rank_pids(cluster, 1), "node 1's rank never started"
    time.sleep(1.0)
    start = time.monotonic()
    fault()
    thread.join(timeout=180)
    assert ended.is_set(), "the cell did not fail within 180 s of the fault"
    assert errors and isinstance(errors[0], CellFailed), errors
    return str(errors[0]), time.monotonic() - start


def test_a_rank_killed_mid_step_fails_the_cell_naming_its_node(
    netns_cluster: Cluster, tmp_path: Path
) -> None:
    """Fault injection: SIGKILL to node 1's rank while it trains. The cell fails within seconds
    naming node 1 and the signal; nothing is left (qdiscs, processes)."""

    def kill() -> None:
        for pid in _rank_pids(netns_cluster, 1):
            os.kill(pid, signal.SIGKILL)

    message, took = _fault_mid_cell(netns_cluster, tmp_path, kill)
    print(f"rank killed: failed after {took:.1f} s: {message.splitlines()[0]}")
    assert message.startswith("training failed on node1: exit 137: a rank was killed by SIGKILL")
    assert took < 30
    assert_clean(netns_cluster)


def test_a_link_down_mid_cell_fails_at_the_timeout_and_leaves_nothing(
    netns_cluster: Cluster, tmp_path: Path
) -> None:
    """Fault injection: node 1's experiment interface goes down while it trains. The ranks
    hang in gloo; the cell fails at run.timeout_s, killed on every node, and the interface
    comes back for the next test."""
    ns = ns_name(netns_cluster.name, 1)

    def link_down() -> None:
        subprocess.run(["ip", "-n", ns, "link", "set", "exp0", "down"], check=True)

    try:
        message, took = _fault_mid_cell(netns_cluster, tmp_path, link_down, timeout_s=12)
    finally:
        subprocess.run(["ip", "-n", ns, "link", "set", "exp0", "up"], check=True)
    print(f"link down: failed after {took:.1f} s: {message.splitlines()[0]}")
    assert "timed out" in message, message
    assert took < 12 + 60
    assert_clean(netns_cluster)


# A cell run by a process of its own (as Snakemake's run_cell job is), for signalling it.
_CELL_PROCESS = """
import json, sys
from pathlib import Path
from commscope.cluster.hosts import Cluster
from commscope.experiment.cell import run_cell, signals_end_the_cell
from commscope.experiment.launch import training_workload
from commscope.spec.settings import CellSettings, RunSettings
cluster = Cluster.from_json(Path(sys.argv[1]))
values, model, strategy, run_values = json.loads(sys.argv[3])
cell, run = CellSettings.from_mapping(values), RunSettings.from_mapping(run_values)
with signals_end_the_cell():
    run_cell(cluster, cell, training_workload(cell, model, strategy, run), run, Path(sys.argv[2]))
"""


def test_sigterm_mid_cell_unshapes_and_kills_everything(
    netns_cluster: Cluster, tmp_path: Path
) -> None:
    """Fault injection: SIGTERM to the process running a shaped cell (what Snakemake sends its
    jobs when it is stopped). The cell ends within seconds, its links unshaped and its ranks,
    samplers and probes killed on every node."""
    spec = json.dumps([cell(steps=100000, bw="50mbit"), MODEL, DDP, RUN])
    cluster_json = tmp_path / "cluster.json"
    netns_cluster.to_json(cluster_json)
    proc = subprocess.Popen(
        [sys.executable, "-c", _CELL_PROCESS, str(cluster_json), str(tmp_path / "out"), spec],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _rank_pids(netns_cluster, 1) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
        time.sleep(1.0)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"SIGTERM: the cell ended after {took:.1f} s")
    assert proc.returncode != 0
    assert "CellInterrupted: stopped by SIGTERM" in stderr, stderr[-2000:]
    assert took < 30
    assert_clean(netns_cluster)


@pytest.mark.parametrize(
    ("mapping", "tp_groups", "dp_groups"),
    [("pp-dp-tp", {"0,1", "2,3"}, {"0,2", "1,3"}), ("tp-dp", {"0,2", "1,3"}, {"0,1", "2,3"})],
)
def test_the_mapping_places_tp_inside_or_across_nodes(
    netns_cluster: Cluster,
    tmp_path: Path,
    mapping: str,
    tp_groups: set[str],
    dp_groups: set[str],
) -> None:
    # 2 nodes x 2 ranks: torchrun numbers ranks node by node, so the innermost mesh dimension
    # pairs ranks on one node. pp-dp-tp keeps TP's per-layer all-reduces inside a node;
    # tp-dp sends them across and keeps the gradient all-reduce inside instead.
    strategy = {"dp": -1, "tp": 2, "mapping": mapping}
    # 4 ranks starting torch on shared cores: allow more than RUN's 60 s.
    out = run_training(
        netns_cluster,
        cell(strategy="dp-tp", ranks_per_node=2, bw="none"),
        MODEL,
        strategy,
        RUN | {"timeout_s": 240},
        tmp_path,
    )
    ops = pd.concat(
        [
            pd.read_parquet(out / f"node{n}" / f"ops_rank{r}.parquet")
            for n in (0, 1)
            for r in (2 * n, 2 * n + 1)
        ],
        ignore_index=True,
    )
    assert (ops["node"] == ops["rank"] // 2).all()
    steps = ops[ops["step"] >= 0]
    tp = steps[steps["source"] == "functional"]
    dp = steps[(steps["source"] == "c10d") & (steps["op"] == "allreduce")]
    assert set(tp["group_ranks"]) == tp_groups
    assert set(dp["group_ranks"]) == dp_groups
    plan = ParallelPlan.from_dict(strategy).resolve(4)
    for r in range(4):
        assert set(tp[tp["rank"] == r]["group_ranks"]) == {
            ",".join(map(str, plan.group_of("tp", r)))
        }
        assert set(dp[dp["rank"] == r]["group_ranks"]) == {
            ",".join(map(str, plan.group_of("dp", r)))
        }
    node_of = dict(zip(ops["rank"], ops["node"], strict=False))
    tp_nodes = {frozenset(node_of[int(x)] for x in g.split(",")) for g in tp_groups}
    assert all(len(nodes) == (1 if mapping == "pp-dp-tp" else 2) for nodes in tp_nodes)
    assert_clean(netns_cluster)
