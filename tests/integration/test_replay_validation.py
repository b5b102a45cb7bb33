"""Replay validation on the netns cluster (issue 16, item 3), each case a real run:

(a) a measured training cell of each base strategy (gpt-tiny on 2 nodes x 1 rank, 6 steps,
    unshaped, as config/config.yaml's replays) replayed on its own link: every rank's steady
    steps are the source's op by op and the replay's median steady step is within 10 % of the
    source's;
(b) the 8 DLRM execution traces (tests/data/external/param) imported and replayed on 4 nodes
    x 2 ranks: the uneven all-to-alls' splits are the trace's bytes, byte for byte, and the
    wire agrees with the ops per node and per node pair;
(c) seed 002's GPT-1.5B on 16 GPUs ((p, t, d) = (4, 2, 2)), predicted, scaled by 1e-4 and
    replayed on 2 nodes x 8 ranks as the scenario places it: the wire's node x node matrix is
    the prediction's (gloo's algorithms) x scale within the cross-validation's tolerance, and
    every rank's bytes are the prediction's x scale.

Run alone (each case starts 2-16 ranks on this 2-core machine, and (a) compares step times):
``COMMSCOPE_TEST_CLUSTER=csd5 COMMSCOPE_TEST_OCTET=250 pytest -s
tests/integration/test_replay_validation.py``. The heavier measurement (the largest replay
that runs here) is benchmarks/replay.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from commscope.cell.parse import build_cell_tables, cell_table_paths
from commscope.cluster.hosts import Cluster
from commscope.cluster.netns import provision_netns, teardown_netns
from commscope.collectives.traffic import op_sends
from commscope.config import filled_cell, read_yaml, strategy_spec
from commscope.contracts import DTYPE_SIZES, IMPORT_TABLES
from commscope.experiment.cell import run_cell
from commscope.experiment.launch import training_workload
from commscope.metrics import step_times
from commscope.metrics.crosscheck import CROSSCHECK_FLOOR_BYTES_PER_STEP, CROSSCHECK_TOLERANCE
from commscope.metrics.imported import analyze_import_files
from commscope.metrics.io import compute_cell_metrics
from commscope.predict.matrix import step_rank_matrix
from commscope.predict.ops import predict_step
from commscope.predict.scenarios import resolve_scenario
from commscope.replay import program_bytes
from commscope.replay.cell import build_cell_program, compare_program, replay_workload
from commscope.spec.settings import CellSettings, RunSettings

from .conftest import CLUSTER_NAME, EXP_SUBNET, MGMT_SUBNET, integration_skip_reason
from .test_runner import assert_clean

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONFIG = read_yaml(ROOT / "config" / "config.yaml")
DLRM = ROOT / "tests" / "data" / "external" / "param" / "dlrm_pytorch_et"
# The study's run settings, on a port of our own.
RUN = RunSettings.from_mapping({**CONFIG["run"], "master_port": 29581})
WARMUP = RUN.warmup_steps
NETNS = {"backend": "netns"}
# (a): the replay's median steady step against the source's, on the same link.
STEP_TOLERANCE = 0.10
SCENARIO = "gpt-1.5b-16gpu-default"
SCENARIO_SCALE = 1e-4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """4 nodes (DLRM's 4 x 2; the other cases take the first 2), torn down at the end."""
    reason = integration_skip_reason()
    if reason:
        pytest.skip(reason)
    state_dir = tmp_path_factory.mktemp("replay-validation")
    built = provision_netns(
        CLUSTER_NAME, 4, state_dir, mgmt_subnet=MGMT_SUBNET, exp_subnet=EXP_SUBNET
    )
    try:
        yield built
    finally:
        teardown_netns(CLUSTER_NAME, state_dir)


def replay_cell(name: str, nodes: int, ranks_per_node: int, steps: int) -> dict[str, Any]:
    """The sweep values of replay ``name``'s cell, unshaped."""
    return filled_cell(
        {"strategy": "replay", "model": name, "nodes": nodes, "ranks_per_node": ranks_per_node,
         "bw": "none", "steps": steps}  # fmt: skip
    )


def run_replay(
    cluster: Cluster,
    values: dict[str, Any],
    entry: dict[str, Any],
    source: dict[str, Path],
    out: Path,
    scenario: dict[str, Any] | None = None,
    warmup_steps: int = WARMUP,
) -> tuple[pd.DataFrame, Path, dict[str, Path]]:
    """Build the replay cell's program as the workflow does (build_cell_program), run it on
    ``cluster``, parse it and compute its metrics; returns the program, the cell's metrics
    directory and its trace tables."""
    program_path, meta_path = out / "replay" / "program.parquet", out / "replay" / "replay.json"
    program = build_cell_program(
        cell=values, replay=entry, scenario=scenario or {}, source=source,
        warmup_steps=warmup_steps, cluster=NETNS, out_program=program_path, out_meta=meta_path,
    ).table  # fmt: skip
    cell = CellSettings.from_mapping(values)
    raw = run_cell(cluster, cell, replay_workload(program_path, meta_path, RUN), RUN, out / "raw")
    tables = build_cell_tables(raw, cell, warmup_steps, cell_table_paths(out / "trace"))
    compute_cell_metrics(out / "trace", out / "metrics")
    return program, out / "metrics", tables


def steady_step_s(steps: pd.DataFrame, warmup_steps: int = WARMUP) -> float:
    """Median steady step, first rank in to last rank out (the timing table's measure)."""
    table = step_times(steps, warmup_steps)
    return float(table[~table["warmup"].astype(bool)]["duration_s"].median())


def assert_exact(program: pd.DataFrame, ops: pd.DataFrame, warmup_steps: int = WARMUP) -> None:
    """compare_program: every rank's steady steps are the program's, op by op."""
    compare = compare_program(program, ops, warmup_steps)
    assert len(compare) > 0
    bad = compare[~(compare["match"] & compare["sizes_match"] & compare["sequence_match"])]
    assert bad.empty, bad.to_string()


def assert_wire_agrees(metrics: Path, pairs: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The cell's cross-validation passes per node and direction and per node pair."""
    check = pd.read_parquet(metrics / "crosscheck.parquet")
    assert len(check) > 0 and check["passed"].all(), check.T.to_string()
    matrix = pd.read_parquet(metrics / "matrix_check.parquet")
    assert len(matrix) == pairs and matrix["passed"].all(), matrix.T.to_string()
    return check, matrix


def sequences(ops: pd.DataFrame) -> dict[tuple[int, int], tuple[tuple[Any, ...], ...]]:
    """Per (rank, step): the ops in issue order as (op, numel, bytes, bytes_out, dtype,
    group_ranks, peer, root, split_bytes)."""
    cols = ["op", "numel", "bytes", "bytes_out", "dtype", "group_ranks", "peer", "root",
            "split_bytes"]  # fmt: skip
    frame = ops.sort_values(["rank", "t_issue_ns"]).copy()
    frame["split_bytes"] = frame["split_bytes"].map(lambda s: s if isinstance(s, str) else "")
    return {
        (int(rank), int(step)): tuple(g[cols].itertuples(index=False, name=None))
        for (rank, step), g in frame.groupby(["rank", "step"])
    }


# --------------------------------------------------------------------- (a) measured cells


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "tp", "pp"])
def test_a_measured_cell_replays_exactly_and_in_its_step_time(
    cluster: Cluster, tmp_path: Path, strategy: str
) -> None:
    """The study's ``<strategy>-replayed`` entry: its source cell trained here, then replayed
    on the same link from the source's parsed ops, steps and cell.json."""
    name = f"{strategy}-replayed"
    entry = CONFIG["replays"][name]
    source_values = filled_cell(dict(entry["source"]["cell"]))
    source_cell = CellSettings.from_mapping(source_values)
    workload = training_workload(
        source_cell, CONFIG["models"][source_values["model"]], strategy_spec(CONFIG, strategy), RUN
    )
    raw = run_cell(cluster, source_cell, workload, RUN, tmp_path / "source" / "raw")
    source = build_cell_tables(
        raw, source_cell, WARMUP, cell_table_paths(tmp_path / "source" / "trace")
    )
    values = replay_cell(name, source_values["nodes"], source_values["ranks_per_node"],
                         source_values["steps"])  # fmt: skip
    program, metrics, tables = run_replay(
        cluster, values, entry, {k: source[k] for k in ("ops", "steps", "cell")},
        tmp_path / "replay",
    )  # fmt: skip
    ops = pd.read_parquet(tables["ops"])
    assert_exact(program, ops)
    # Each replayed steady step is one of the source's steady steps, op for op (the builder
    # maps replay step i to source steady step i mod 4).
    src_ops = pd.read_parquet(source["ops"])
    want = sequences(src_ops[src_ops["step"] >= WARMUP])
    got = sequences(ops[ops["step"] >= WARMUP])
    assert len(got) == 2 * (values["steps"] - WARMUP)
    for (rank, step), seq in got.items():
        assert seq in {s for (r, _), s in want.items() if r == rank}, (rank, step)
    assert_wire_agrees(metrics, pairs=2)
    source_s = steady_step_s(pd.read_parquet(source["steps"]))
    replay_s = steady_step_s(pd.read_parquet(tables["steps"]))
    error = replay_s / source_s - 1
    print(f"\n(a) {strategy}: source step {source_s * 1e3:.1f} ms, replay {replay_s * 1e3:.1f} ms,"
          f" error {error:+.1%}, ops/step {int((program['kind'] == 'op').sum() / 6)}")  # fmt: skip
    assert abs(error) <= STEP_TOLERANCE, (strategy, source_s, replay_s)
    assert_clean(cluster)
