"""Traces recorded elsewhere (Kineto, PyTorch/Chakra execution traces, NCCL logs) in the study.

The config's ``imports:`` names trace files; each import is loaded into the ops table by
:mod:`commscope.importers` and gets the op-level metrics a measured cell gets (volume and
messages per op and step, message sizes, the rank x rank communication matrix). Wire counters
and step times need our own runs, so those metrics stay with the sweep cells.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from commscope.contracts import IMPORT_TABLES
from commscope.importers import load_trace
from commscope.metrics.matrix import comm_matrix
from commscope.metrics.volume import message_sizes, op_volume


def load_import(paths: list[Path], name: str) -> pd.DataFrame:
    """All files of one import (one per rank, or one for all) as one ops table."""
    ops = pd.concat([load_trace(p) for p in paths], ignore_index=True)
    if ops.empty:
        raise ValueError(f"imports.{name}: no communication ops found in {list(map(str, paths))}")
    # Traces without step markers (ETs, NCCL logs) are one span: call it step 0 so the per-step
    # metrics count it rather than treating it as set-up.
    if (ops["step"] < 0).all():
        ops["step"] = 0
    ops.insert(0, "cell", f"import:{name}")
    return ops


def analyze_import_files(paths: list[Path], name: str, outputs: Mapping[str, Path]) -> pd.DataFrame:
    """Write the ops table and its op-level metrics of one import to the given files, one per
    name of :data:`commscope.contracts.IMPORT_TABLES` (``ops``, ``summary``, ``op_volume``,
    ``msg_sizes``, ``comm_matrix``); return its one-row summary."""
    missing = [t for t in IMPORT_TABLES if t not in outputs]
    if missing:
        raise ValueError(f"imports.{name}: no output path for tables {missing}")
    ops = load_import(paths, name)
    tables = {
        "ops": ops,
        "op_volume": op_volume(ops, per_rank=True),
        "msg_sizes": message_sizes(ops),
        "comm_matrix": comm_matrix(ops),
        "summary": import_summary(ops, name),
    }
    for table in IMPORT_TABLES:
        Path(outputs[table]).parent.mkdir(parents=True, exist_ok=True)
        tables[table].to_parquet(outputs[table], index=False)
    return tables["summary"]


def import_summary(ops: pd.DataFrame, name: str) -> pd.DataFrame:
    """One row: the import's format(s), ranks, steps, messages and bytes per step, and its op
    mix (bytes per step by op, largest first, in MB)."""
    steps = ops[ops["step"] >= 0]
    n_steps = max(steps["step"].nunique(), 1)
    per_op = steps.groupby("op")["bytes"].sum() / n_steps
    return pd.DataFrame(
        [
            {
                "import": name,
                "format": ",".join(sorted(ops["source"].unique())),
                "ranks": int(ops["rank"].nunique()),
                "steps": int(steps["step"].nunique()),
                "messages / step": len(steps) / n_steps,
                "bytes / step": float(steps["bytes"].sum()) / n_steps,
                "op mix (bytes / step)": ", ".join(
                    f"{op} {b / 1e6:.2f} MB"
                    for op, b in per_op.sort_values(ascending=False).items()
                ),
            }
        ]
    )
