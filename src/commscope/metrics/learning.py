"""Training progress and MoE routing over steps (learning runs), as tables (their figures:
:mod:`commscope.plots.learning`).

Tables come from every cell's ``trace/train.parquet`` (per rank and step: ``train_loss``) and
``trace/moe.parquet`` (per rank, step, MoE layer and destination EP rank: tokens sent and
received, tokens dropped). The MoE *non-uniform factor* of an iteration is the spread of the
all-to-all volume across ranks: max minus min of the tokens each rank receives, over the mean
(0 = perfectly balanced experts; it moves as the router learns).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from commscope.contracts import PARAM_COLUMNS

PARAMS = list(PARAM_COLUMNS)


def _concat(paths: list[Path]) -> pd.DataFrame:
    frames = [pd.read_parquet(p) for p in paths]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def loss_curve(train: pd.DataFrame) -> pd.DataFrame:
    """Mean training loss over ranks per cell and step (columns: params, step, train_loss)."""
    if train.empty:
        return pd.DataFrame(columns=[*PARAMS, "step", "train_loss"])
    keys = [c for c in PARAMS if c in train] + ["step"]
    return train.groupby(keys, as_index=False)["train_loss"].mean()


def routing(moe: pd.DataFrame) -> pd.DataFrame:
    """Per cell, step and MoE layer: tokens each EP rank received (all-to-all dispatch), and the
    iteration's non-uniform factor (max - min received, over the mean) and dropped tokens."""
    cols = [*PARAMS, "step", "layer", "dst_rank", "tokens", "nonuniform", "dropped"]
    if moe.empty:
        return pd.DataFrame(columns=cols)
    keys = [c for c in PARAMS if c in moe] + ["step", "layer"]
    received = moe.groupby([*keys, "dst_rank"], as_index=False)["tokens_sent"].sum()
    received = received.rename(columns={"tokens_sent": "tokens"})
    per_iter = received.groupby(keys)["tokens"]
    spread = (per_iter.max() - per_iter.min()) / per_iter.mean()
    # Each rank reports its own drops once per layer and step: sum over ranks, not destinations.
    dropped = moe.drop_duplicates([*keys, "rank"]).groupby(keys)["dropped"].sum()
    out = received.merge(spread.rename("nonuniform").reset_index(), on=keys)
    return out.merge(dropped.rename("dropped").reset_index(), on=keys)


def aggregate_learning(
    train_paths: list[Path], moe_paths: list[Path], loss_out: Path, routing_out: Path
) -> None:
    """Write :func:`loss_curve` of every cell's ``train.parquet`` to ``loss_out`` and
    :func:`routing` of every cell's ``moe.parquet`` to ``routing_out``."""
    for out in (loss_out, routing_out):
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    loss_curve(_concat(train_paths)).to_parquet(loss_out, index=False)
    routing(_concat(moe_paths)).to_parquet(routing_out, index=False)


LEARNING_MIN_STEPS = 20  # shorter dense runs measure traffic, not learning


def learning_table(loss_path: Path, routing_path: Path) -> pd.DataFrame:
    """Per learning run (an MoE cell, or a cell of at least 20 steps): loss at the first and last
    step, and the MoE non-uniform factor at both ends (first MoE layer), for the report."""
    loss = pd.read_parquet(loss_path)
    if loss.empty:
        return pd.DataFrame()
    rows = []
    route = pd.read_parquet(routing_path)
    moe_cells = set(route.cell) if not route.empty else set()
    for cell, frame in loss.dropna(subset=["train_loss"]).groupby("cell"):
        frame = frame.sort_values("step")
        if cell not in moe_cells and frame.step.max() + 1 < LEARNING_MIN_STEPS:
            continue
        row = {
            "strategy": frame.strategy.iloc[0],
            "model": frame.model.iloc[0],
            "nodes x ranks": f"{frame.nodes.iloc[0]} x {frame.ranks_per_node.iloc[0]}",
            "bw": frame.bw.iloc[0],
            "steps": int(frame.step.max()) + 1,
            "first loss": float(frame.train_loss.iloc[0]),
            "last loss": float(frame.train_loss.iloc[-1]),
        }
        moe = route[route.cell == cell] if not route.empty else route
        if not moe.empty:
            layer = sorted(moe.layer.unique())[0]
            per_step = moe[moe.layer == layer].drop_duplicates("step").sort_values("step")
            row["non-uniform first"] = float(per_step.nonuniform.iloc[0])
            row["non-uniform last"] = float(per_step.nonuniform.iloc[-1])
        rows.append(row)
    return pd.DataFrame(rows)
