"""Traces recorded elsewhere (Kineto, PyTorch/Chakra execution traces, NCCL logs) in the study.

The config's ``imports:`` names trace files; each import is loaded into the ops table by
:mod:`commscope.importers` and gets the op-level metrics a measured cell gets (volume and
messages per op and step, message sizes, the rank x rank communication matrix). Wire counters
and step times need our own runs, so those metrics stay with the sweep cells.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from commscope import metrics
from commscope.importers import load_trace


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


def analyze_import(paths: list[Path], name: str, out_dir: Path) -> pd.DataFrame:
    """Write ops, op_volume, msg_sizes and comm_matrix parquet for one import; return its
    one-row summary (also written as summary.parquet)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ops = load_import(paths, name)
    ops.to_parquet(out_dir / "ops.parquet", index=False)
    volume = metrics.op_volume(ops, per_rank=True)
    volume.to_parquet(out_dir / "op_volume.parquet", index=False)
    metrics.message_sizes(ops).to_parquet(out_dir / "msg_sizes.parquet", index=False)
    metrics.comm_matrix(ops).to_parquet(out_dir / "comm_matrix.parquet", index=False)
    steps = ops[ops["step"] >= 0]
    n_steps = max(steps["step"].nunique(), 1)
    per_op = steps.groupby("op")["bytes"].sum() / n_steps
    summary = pd.DataFrame(
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
    summary.to_parquet(out_dir / "summary.parquet", index=False)
    return summary
