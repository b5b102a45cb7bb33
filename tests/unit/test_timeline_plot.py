"""The op timeline (commscope.plots.timeline) on a synthetic study of two strategies whose
chosen cell, step, rows, bars and wire bins are known."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from commscope.plots.timeline import (
    COMPUTE,
    plot_timeline,
    timeline_cells,
    timeline_panels,
)
from commscope.spec.link import axes_shape

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
STEP_MS = 100
WARMUP = 1
N_STEPS = 4  # steps 0..3, step 0 warm-up; the steps are equal, so the zoomed (typical) step is 3
# Rank 1 enters every step 5 ms after rank 0 and leaves with it; the op of each step runs from
# 40 to 70 ms after rank 0's start on both ranks.
RANK_LAG_MS = 5
OP_MS = (40, 70)


def _params(strategy: str, model: str, nodes: int, bw: str, delay: str = "0ms") -> dict:
    params = {
        "strategy": strategy,
        "model": model,
        "nodes": nodes,
        "ranks_per_node": 1,
        "bw": bw,
        "delay": delay,
        "jitter": "0ms",
        "loss": "0pct",
        "cc": "cubic",
        "steps": N_STEPS,
        "repeat": 0,
    }
    cell = "/".join(f"{k}~{v}" for k, v in params.items())
    return {"cell": cell, **params}


# (strategy, model, nodes, bw, delay): the first of each strategy is the one to be chosen.
CELLS = [
    ("ddp", "gpt-tiny", 2, "none", "0ms"),  # unshaped, default model, 2 nodes
    ("ddp", "gpt-tiny", 2, "50mbit", "0ms"),  # capped
    ("ddp", "gpt-tiny", 4, "none", "0ms"),  # more nodes
    ("ddp", "gpt-tiny", 2, "none", "5ms"),  # delayed
    ("ddp", "resnet", 2, "none", "0ms"),  # not the default model
    ("tp", "gpt-tiny", 2, "200mbit", "0ms"),  # no unshaped tp cell: the highest cap wins
    ("tp", "gpt-tiny", 2, "100mbit", "0ms"),
    ("tp", "gpt-tiny", 4, "100mbit", "0ms"),
]
PLANS = {"ddp": {"dp": -1}, "tp": {"tp": -1}}


def _step_start(step: int, rank: int) -> int:
    return T0 + step * STEP_MS * MS + rank * RANK_LAG_MS * MS


def _cell_tables(params: dict) -> dict[str, pd.DataFrame]:
    """ops, steps, step_times and throughput of one cell: ``nodes`` ranks, one per node, one
    op per rank and step on the world group, throughput bins of 0.1 ms (nodes 0 and 1, every
    step) and 1 ms (node 0)."""
    nodes = params["nodes"]
    op = "allreduce" if params["strategy"] == "ddp" else "allgather"
    group = ",".join(str(r) for r in range(nodes))
    ops, steps, step_times, bins = [], [], [], []
    for step in range(N_STEPS):
        end = T0 + (step + 1) * STEP_MS * MS - 2 * MS
        for rank in range(nodes):
            start = _step_start(step, rank)
            steps.append((rank, rank, step, "step", start, end))
            t_op = T0 + step * STEP_MS * MS
            ops.append(
                (rank, op, group, nodes, -1, step, step, "bwd", 1000, t_op + OP_MS[0] * MS)
                + (t_op + OP_MS[1] * MS,)
            )
        first = _step_start(step, 0)
        step_times.append((step, first, end, (end - first) / 1e9, nodes, step < WARMUP))
        for node in (0, 1):
            for i in range(STEP_MS * 10):
                t = T0 + step * STEP_MS * MS + i * MS // 10
                rate = 1e6 * (node + 1) * (1 + i)  # node 1's bins are twice node 0's
                bins.append((node, "exp0", 0.1, t, rate, rate / 2, True))
        bins += [
            (0, "exp0", 1.0, T0 + step * STEP_MS * MS + i * MS, 5.0, 5.0, True)
            for i in range(STEP_MS)
        ]
    frames = {
        "ops": pd.DataFrame(
            ops,
            columns=["rank", "op", "group_ranks", "group_size", "peer", "seq", "step", "phase"]
            + ["bytes", "t_issue_ns", "t_end_ns"],
        ),
        "steps": pd.DataFrame(
            steps, columns=["rank", "node", "step", "phase", "t_start_ns", "t_end_ns"]
        ),
        "step_times": pd.DataFrame(
            step_times,
            columns=["step", "t_start_ns", "t_end_ns", "duration_s", "n_ranks", "warmup"],
        ),
        "throughput": pd.DataFrame(
            bins,
            columns=["node", "iface", "bin_ms", "t_start_ns", "tx_bps", "rx_bps", "resolved"],
        ),
    }
    return {name: df.assign(**params) for name, df in frames.items()}


@pytest.fixture(scope="module")
def study() -> dict:
    cells = [_params(*c) for c in CELLS]
    tables = {c["cell"]: _cell_tables(c) for c in cells}
    return {
        "cells": cells,
        # The summary carries each cell's link as numbers (cell.json's applied shape).
        "summary": pd.DataFrame([{**c, **axes_shape(c).numbers()} for c in cells]),
        "step_times": pd.concat([t["step_times"] for t in tables.values()], ignore_index=True),
        "throughput": pd.concat([t["throughput"] for t in tables.values()], ignore_index=True),
        "ops": {cell: t["ops"] for cell, t in tables.items()},
        "steps": {cell: t["steps"] for cell, t in tables.items()},
        "plans": {c["cell"]: PLANS[c["strategy"]] for c in cells},
    }


def _expected_cells(study: dict) -> list[str]:
    first = {}
    for params in study["cells"]:
        first.setdefault(params["strategy"], params["cell"])
    return [first["ddp"], first["tp"]]


def test_timeline_cells_prefer_unshaped_default_model_two_nodes(study: dict) -> None:
    chosen = timeline_cells(study["summary"])
    assert chosen["strategy"].tolist() == ["ddp", "tp"]
    assert chosen["cell"].tolist() == _expected_cells(study)


def test_timeline_cells_fall_back_to_the_fewest_nodes(study: dict) -> None:
    # Without 2-node cells the smallest unshaped cell is taken, never a one-node one.
    cells = [_params("ddp", "gpt-tiny", n, "none") for n in (1, 8, 4)]
    assert timeline_cells(pd.DataFrame(cells))["nodes"].tolist() == [4]


def _panels(study: dict) -> list:
    return timeline_panels(
        study["summary"],
        study["step_times"],
        study["throughput"],
        study["ops"],
        study["steps"],
        study["plans"],
    )


def test_timeline_panels_show_the_zoomed_step_of_each_chosen_cell(study: dict) -> None:
    panels = _panels(study)
    assert [p.strategy for p in panels] == ["ddp", "tp"]
    assert [p.cell for p in panels] == _expected_cells(study)
    last = N_STEPS - 1
    for panel in panels:
        assert panel.step == last  # the typical measured step: the one with 100 µs wire bins
        assert panel.ranks == [(0, 0), (1, 1)]  # ranks as rows, top to bottom, with their node
        # First rank in (rank 0) to last rank out: 100 ms less the 2 ms both leave early.
        assert panel.step_ms == pytest.approx(STEP_MS - 2)
        assert panel.median_step_ms == pytest.approx(STEP_MS - 2)
    assert panels[0].lanes == ["dp"] and panels[1].lanes == ["tp"]  # group kinds of sync
    # The link in the report's words (spec.link.link_label of the summary's numbers).
    assert panels[0].title.endswith(", unshaped") and "cap 200 Mbit/s" in panels[1].title


def test_timeline_bars_are_the_steps_ops_and_the_compute_between(study: dict) -> None:
    bars = _panels(study)[0].bars
    comm = bars[bars["kind"] != COMPUTE]
    # One op per rank in the step, in ms from rank 0's start (the step's start).
    assert comm[["rank", "kind", "op", "lane"]].values.tolist() == [
        [0, "dp", "allreduce", 0],
        [1, "dp", "allreduce", 0],
    ]
    assert comm["t0_ms"].tolist() == pytest.approx([OP_MS[0]] * 2)
    assert comm["t1_ms"].tolist() == pytest.approx([OP_MS[1]] * 2)
    compute = bars[bars["kind"] == COMPUTE]
    # Each rank computes from its own start to the op and from the op to the step's end.
    np.testing.assert_allclose(
        compute[["rank", "t0_ms", "t1_ms"]].to_numpy("float64"),
        [
            [0, 0.0, OP_MS[0]],
            [0, OP_MS[1], STEP_MS - 2],
            [1, RANK_LAG_MS, OP_MS[0]],
            [1, OP_MS[1], STEP_MS - 2],
        ],
    )


def test_timeline_wire_is_node_zero_at_100us_over_the_step(study: dict) -> None:
    wire = _panels(study)[0].wire
    # 100 µs bins from the step's start to its end (98 ms): 980 bins of node 0 only.
    assert len(wire) == (STEP_MS - 2) * 10
    assert wire["t_ms"].iloc[0] == pytest.approx(0.0)
    assert np.diff(wire["t_ms"]) == pytest.approx(np.full(len(wire) - 1, 0.1))
    # Node 0's rate in bin i of a step is (1 + i) Mbit/s (node 1's would be twice that).
    assert wire["tx_bps"].to_numpy() == pytest.approx(1e6 * (1 + np.arange(len(wire))))


def test_plot_timeline_writes_a_deterministic_png(study: dict, tmp_path: Path) -> None:
    files = {}
    for name in ("summary", "step_times", "throughput"):
        files[name] = tmp_path / f"{name}.parquet"
        study[name].to_parquet(files[name])
    traces = {}
    for params in study["cells"]:
        cell, trace = params["cell"], tmp_path / "runs" / params["cell"] / "trace"
        trace.mkdir(parents=True)
        study["ops"][cell].to_parquet(trace / "ops.parquet")
        study["steps"][cell].to_parquet(trace / "steps.parquet")
        (trace / "cell.json").write_text(json.dumps({"plan": study["plans"][cell]}))
        traces[cell] = {
            k: trace / f"{k}.{e}"
            for k, e in (("ops", "parquet"), ("steps", "parquet"), ("cell", "json"))
        }
    pngs = [
        plot_timeline(
            files["summary"], files["step_times"], files["throughput"], traces, tmp_path / out
        )
        for out in ("a.png", "b.png")
    ]
    assert pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pngs[0].read_bytes() == pngs[1].read_bytes()


def test_timeline_without_cells_draws_a_no_data_figure(tmp_path: Path) -> None:
    empty = pd.DataFrame(columns=["cell", "strategy"])
    assert timeline_panels(empty, empty, empty, {}, {}, {}) == []
    path = tmp_path / "summary.parquet"
    empty.to_parquet(path)
    png = plot_timeline(path, path, path, {}, tmp_path / "t.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
