"""How far the per-cell step-time prediction is from the measured step, recomputed with the
current code: `python benchmarks/prediction_error.py RESULTS [--config CONFIG]`.

For every training cell under ``RESULTS/runs`` that has a trace (``trace/cell.json``,
``ops.parquet``, ``steps.parquet``), rebuilds its timing row with
:func:`commscope.predict.cell.predict_timing` (the cell's recorded model and strategy from
``CONFIG``, default ``RESULTS/../config/config.yaml``; the microbenchmark fits under
``RESULTS/microbench``) and prints the distribution of ``time_error`` = (predicted - measured) /
measured: overall, per strategy and per link, with the stored ``timing.parquet``'s error beside
it (the code that ran the study). Starts no cluster and writes nothing unless ``--csv PATH``.

Cells whose fidelity verdict (the cell's ``metrics/summary.parquet``: ``host_limited``) says
host-limited are left out of every distribution (how many, and their own errors, printed);
``--exclude-loss`` leaves lossy links out too (TCP retransmission timeouts, which an
alpha-beta model does not describe).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from commscope.config import read_yaml, strategy_spec
from commscope.predict.cell import _as_recorded, predict_timing
from commscope.predict.ops import predict_ops
from commscope.spec.settings import CellSettings


def cell_row(cell_dir: Path, config: dict, fits: pd.DataFrame | None) -> dict | None:
    """One cell's recomputed timing row and its stored error; None for a replay or no trace."""
    trace = cell_dir / "trace"
    if not (trace / "cell.json").exists() or not (trace / "ops.parquet").exists():
        return None
    meta = json.loads((trace / "cell.json").read_text())
    params = meta["params"]
    if params["strategy"] == "replay":
        return None
    cell = CellSettings.from_mapping(params)
    backend = meta.get("backend") or "gloo"
    model_spec = config["models"][params["model"]]
    plan_spec = _as_recorded(strategy_spec(config, params["strategy"]), meta.get("plan"))
    warmup = int(meta.get("warmup_steps", config.get("run", {}).get("warmup_steps", 2)))
    pred = predict_ops(model_spec, plan_spec, cell.nodes, cell.ranks_per_node, backend=backend)
    ops = pd.read_parquet(trace / "ops.parquet")
    steps = pd.read_parquet(trace / "steps.parquet")
    row = predict_timing(pred, ops, steps, cell, warmup, fits, backend=backend)
    out = {"cell": meta["cell"], **params, **row.iloc[0].to_dict()}
    stored = cell_dir / "predict" / "timing.parquet"
    out["stored_error"] = (
        float(pd.read_parquet(stored)["time_error"].iloc[0]) if stored.exists() else math.nan
    )
    out["host_limited"] = _host_limited(cell_dir)
    return out


def _host_limited(cell_dir: Path) -> bool | None:
    """The fidelity monitor's verdict for the cell (its summary's ``host_limited``); None when
    the cell was not monitored or its study had no monitor."""
    summary = cell_dir / "metrics" / "summary.parquet"
    if not summary.exists():
        return None
    table = pd.read_parquet(summary)
    if "host_limited" not in table.columns or table["host_limited"].isna().all():
        return None
    if "monitored" in table.columns and not bool(table["monitored"].iloc[0]):
        return None
    return bool(table["host_limited"].iloc[0])


def distribution(errors: pd.Series) -> str:
    """Median, quartiles and range of relative errors, as percentages."""
    e = errors.dropna()
    if e.empty:
        return "n=0"
    q = e.quantile([0.0, 0.25, 0.5, 0.75, 1.0]) * 100
    return (
        f"n={len(e):3d} median {q[0.5]:+6.1f}%  IQR [{q[0.25]:+6.1f}, {q[0.75]:+6.1f}]  "
        f"range [{q[0.0]:+6.1f}, {q[1.0]:+6.1f}]  |err| median {e.abs().median() * 100:5.1f}%"
    )


def link_label(row: pd.Series) -> str:
    """The cell's link class: lossy, delayed, capped or unshaped."""
    if row["loss"] not in ("0pct", "0%", 0):
        return "loss"
    if row["delay"] not in ("0ms", 0):
        return "delay"
    if row["bw"] != "none":
        return "cap"
    return "unshaped"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--config", type=Path, default=None)
    ap.add_argument("--csv", type=Path, default=None)
    ap.add_argument("--exclude-loss", action="store_true")
    args = ap.parse_args(argv)
    config = read_yaml(args.config or args.results.parent / "config" / "config.yaml")
    fit_paths = sorted((args.results / "microbench").glob("bw~*/**/fit.parquet"))
    fits = pd.concat([pd.read_parquet(p) for p in fit_paths]) if fit_paths else None
    rows = []
    for cj in sorted((args.results / "runs").glob("**/trace/cell.json")):
        try:
            row = cell_row(cj.parent.parent, config, fits)
        except Exception as exc:  # a cell the current code cannot read: say so, go on
            print(f"skip {cj.parent.parent}: {exc!r}", file=sys.stderr)
            continue
        if row is not None:
            rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        print("no cells")
        return 1
    table["link_class"] = table.apply(link_label, axis=1)
    if args.csv:
        table.to_csv(args.csv, index=False)
    headline = table[table["link_class"] != "loss"] if args.exclude_loss else table
    limited = headline["host_limited"].eq(True)
    monitored = int(headline["host_limited"].notna().sum())
    print(
        f"fidelity monitor: {monitored} of {len(headline)} cells monitored, "
        f"{int(limited.sum())} host-limited (left out)"
    )
    if limited.any():
        print(f"host-limited  {distribution(headline.loc[limited, 'time_error'])}")
    headline = headline[~limited]
    print(f"overall now   {distribution(headline['time_error'])}")
    print(f"overall study {distribution(headline['stored_error'])}")
    for key in ("strategy", "link_class"):
        print(f"\nper {key} (now | as stored)")
        for name, group in headline.groupby(key):
            print(f"  {name:12s} {distribution(group['time_error'])}")
            print(f"  {'':12s} {distribution(group['stored_error'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
