"""run_cell on a real 2-node cluster: a good cell, a hung cell, a cell with a crashing rank."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from commscope.cluster.hosts import Cluster
from commscope.runner import CellFailed, run_cell
from commscope.shaping import qdisc_snapshot

pytestmark = pytest.mark.integration

MODEL = {"layers": 2, "hidden": 32, "heads": 2, "seq": 16, "vocab": 64, "batch": 4}
RUN = {
    "timeout_s": 60,
    "sample_hz": 200,
    "master_port": 29531,
    "bucket_cap_mb": 25,
    "microbatches": 2,
    "pp_schedule": "1f1b",
}


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


def leftover_processes() -> str:
    out = subprocess.run(
        ["pgrep", "-af", "[c]ommscope.(workload|sampler)"], capture_output=True, text=True
    )
    return out.stdout


def assert_clean(cluster: Cluster) -> None:
    for host in cluster.hosts():
        with host:
            snap = qdisc_snapshot(host)
        assert all(line.endswith(": default") for line in snap.splitlines()), snap
    assert leftover_processes() == ""


def test_cell_runs_and_fetches_every_nodes_traces(netns_cluster: Cluster, tmp_path: Path) -> None:
    out = run_cell(netns_cluster, cell(), MODEL, RUN, tmp_path / "raw")
    for node in ("node0", "node1"):
        files = {p.name for p in (out / node).iterdir()}
        assert {"counters.parquet", "torchrun.log", "spec.json"} <= files
        assert any(f.startswith("ops_rank") for f in files)
    meta = json.loads((out / "run.json").read_text())
    assert meta["shape"]["rate_bps"] == 100_000_000
    # The qdisc statistics taken while shaped show the tbf on both nodes.
    kinds = {q["kind"] for stats in meta["qdisc_after"].values() for q in stats}
    assert "tbf" in kinds
    counters = pd.read_parquet(out / "node0" / "counters.parquet")
    assert counters.tx_bytes.is_monotonic_increasing
    assert_clean(netns_cluster)


def test_hung_cell_is_killed_everywhere_and_fails_cleanly(
    netns_cluster: Cluster, tmp_path: Path
) -> None:
    # 1 kbit/s cannot carry DDP's first gradient bucket in 4 s: the run hangs in all-reduce.
    with pytest.raises(CellFailed, match="timed out"):
        run_cell(netns_cluster, cell(bw="8kbit", steps=50), MODEL, RUN | {"timeout_s": 4}, tmp_path)
    assert_clean(netns_cluster)
    # What was measured before the kill is still fetched (logs, counters).
    assert (tmp_path / "node0" / "torchrun.log").exists()


def test_crashing_rank_fails_the_cell_fast(netns_cluster: Cluster, tmp_path: Path) -> None:
    # One head split over 2 tensor-parallel ranks: each holds half a head and the attention
    # reshape raises in the first forward (check_study would refuse this config up front).
    bad_model = MODEL | {"heads": 1}
    with pytest.raises(CellFailed, match="exit"):
        run_cell(netns_cluster, cell(strategy="tp"), bad_model, RUN, tmp_path)
    assert_clean(netns_cluster)
