"""Raw per-node run output → tidy per-cell tables (the data contract of docs/traces.md).

Every table repeats the cell's parameters as columns plus ``cell`` (its path id), so
aggregating cells is a concat, never path parsing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.config import SWEEP_AXES, cell_id
from commscope.shaping import LinkShape


def _with_params(frame: pd.DataFrame, cell: dict[str, Any]) -> pd.DataFrame:
    frame = frame.copy()
    for axis in SWEEP_AXES:
        frame[axis] = cell[axis]
    frame["cell"] = cell_id(cell)
    return frame


def _concat(paths: list[Path], what: str, raw_dir: Path) -> pd.DataFrame:
    if not paths:
        raise FileNotFoundError(f"no {what} files under {raw_dir}: did training finish?")
    return pd.concat([pd.read_parquet(p) for p in sorted(paths)], ignore_index=True)


def build_cell_tables(
    raw_dir: Path, cell: dict[str, Any], warmup_steps: int, out_dir: Path
) -> dict[str, Path]:
    """Write ops/steps/counters parquet and cell.json for one cell; returns their paths."""
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run_meta = json.loads((raw_dir / "run.json").read_text())
    node_index = {n["name"]: int(n["index"]) for n in run_meta["nodes"]}

    ops = _concat(list(raw_dir.glob("*/ops_rank*.parquet")), "ops_rank*.parquet", raw_dir)
    steps = _concat(list(raw_dir.glob("*/steps_rank*.parquet")), "steps_rank*.parquet", raw_dir)
    counters = []
    for path in sorted(raw_dir.glob("*/counters.parquet")):
        frame = pd.read_parquet(path)
        frame.insert(0, "node", node_index[path.parent.name])
        counters.append(frame)
    if not counters:
        raise FileNotFoundError(f"no counters.parquet under {raw_dir}: did the sampler run?")
    counters_df = pd.concat(counters, ignore_index=True)
    counters_df = counters_df[
        ["node", "iface", "t_ns", "tx_bytes", "rx_bytes", "tx_packets", "rx_packets"]
    ]
    ranks = sorted(
        (json.loads(p.read_text()) for p in raw_dir.glob("*/rank*.json")), key=lambda m: m["rank"]
    )

    paths = {
        "ops": out_dir / "ops.parquet",
        "steps": out_dir / "steps.parquet",
        "counters": out_dir / "counters.parquet",
        "train": out_dir / "train.parquet",
        "moe": out_dir / "moe.parquet",
        "cell": out_dir / "cell.json",
    }
    # Per-step loss and MoE routing: every rank writes them (empty for dense models).
    for table in ("train", "moe"):
        files = sorted(raw_dir.glob(f"*/{table}_rank*.parquet"))
        frame = (
            pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
            if files
            else pd.DataFrame()
        )
        _with_params(frame, cell).to_parquet(paths[table], index=False)
    _with_params(ops.sort_values(["rank", "t_issue_ns"]), cell).to_parquet(
        paths["ops"], index=False
    )
    _with_params(steps.sort_values(["rank", "t_start_ns"]), cell).to_parquet(
        paths["steps"], index=False
    )
    _with_params(counters_df.sort_values(["node", "t_ns"]), cell).to_parquet(
        paths["counters"], index=False
    )

    shape = LinkShape(**run_meta["shape"])
    meta = {
        "cell": cell_id(cell),
        "params": {axis: cell[axis] for axis in SWEEP_AXES},
        "world_size": ranks[0]["world_size"] if ranks else None,
        "backend": ranks[0]["backend"] if ranks else None,
        "bw_bps": shape.rate_bps,
        "param_bytes": ranks[0]["grad_bytes_local"] if ranks else None,
        "grad_bytes": ranks[0]["grad_bytes_local"] if ranks else None,
        "grad_bytes_per_rank": [r["grad_bytes_local"] for r in ranks],
        "warmup_steps": int(warmup_steps),
        "t0_ns": run_meta["t_start_ns"],
        "t1_ns": run_meta["t_end_ns"],
        "qdisc_before": run_meta.get("qdisc_before"),
        "qdisc_after": run_meta.get("qdisc_after"),
        "torch": ranks[0]["torch"] if ranks else None,
        "plan": ranks[0].get("plan") if ranks else None,
    }
    paths["cell"].write_text(json.dumps(meta, indent=2, default=str))
    return paths
