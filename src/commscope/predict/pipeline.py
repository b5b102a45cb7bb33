"""The predictor in the pipeline: per cell, predict one steady step and compare with the trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.config import SWEEP_AXES
from commscope.predict.model import compare_measured, predict_ops


def predict_cell(
    trace_dir: Path,
    model_spec: dict[str, Any],
    plan_spec: dict[str, Any],
    warmup_steps: int,
    out_dir: Path,
) -> pd.DataFrame:
    """Predict the cell's ops per rank for one steady step; compare with the measured ops.

    Writes ``ops.parquet`` (the prediction) and ``compare.parquet`` (per rank, measured step
    and traffic type: predicted vs measured bytes and messages, ``match``), both carrying the
    cell's parameters; returns the comparison.
    """
    meta = json.loads((Path(trace_dir) / "cell.json").read_text())
    params = meta["params"]
    pred = predict_ops(model_spec, plan_spec, int(params["nodes"]), int(params["ranks_per_node"]))
    measured = pd.read_parquet(Path(trace_dir) / "ops.parquet")
    compare = compare_measured(pred, measured, model_spec, plan_spec, warmup_steps=warmup_steps)
    out_dir.mkdir(parents=True, exist_ok=True)
    for frame in (pred, compare):
        frame.insert(0, "cell", meta["cell"])
        for axis in SWEEP_AXES:
            frame[axis] = params[axis]
    pd.DataFrame(pred).to_parquet(out_dir / "ops.parquet", index=False)
    compare.to_parquet(out_dir / "compare.parquet", index=False)
    return compare


def comparison_table(compare_paths: list[Path]) -> pd.DataFrame:
    """One row per cell and traffic type: bytes and messages per steady step (all ranks),
    predicted vs measured, and whether every rank and step matched exactly."""
    frames = [pd.read_parquet(p) for p in compare_paths]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    compare = pd.concat(frames, ignore_index=True)
    per_step = compare.groupby(["cell", "strategy", "model", "traffic", "step"], as_index=False)[
        ["predicted_bytes", "measured_bytes", "predicted_msgs", "measured_msgs"]
    ].sum()
    table = per_step.groupby(["cell", "strategy", "model", "traffic"], as_index=False).agg(
        predicted_bytes=("predicted_bytes", "first"),
        measured_bytes=("measured_bytes", "mean"),
        predicted_msgs=("predicted_msgs", "first"),
        measured_msgs=("measured_msgs", "mean"),
    )
    exact = compare.groupby(["cell", "traffic"])["match"].all().rename("exact").reset_index()
    return table.merge(exact, on=["cell", "traffic"])
