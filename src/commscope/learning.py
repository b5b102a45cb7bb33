"""Training progress and MoE routing over steps (learning runs).

Tables come from every cell's ``trace/train.parquet`` (per rank and step: ``train_loss``) and
``trace/moe.parquet`` (per rank, step, MoE layer and destination EP rank: tokens sent and
received, tokens dropped). The MoE *non-uniform factor* of an iteration is the spread of the
all-to-all volume across ranks: max minus min of the tokens each rank receives, over the mean
(0 = perfectly balanced experts; it moves as the router learns).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from commscope.metrics import PARAM_COLUMNS

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


def aggregate_learning(train_paths: list[Path], moe_paths: list[Path], out_dir: Path) -> None:
    """Write loss.parquet and routing.parquet for all cells into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    loss_curve(_concat(train_paths)).to_parquet(out_dir / "loss.parquet", index=False)
    routing(_concat(moe_paths)).to_parquet(out_dir / "routing.parquet", index=False)


def plot_learning(learning_dir: Path, out_dir: Path) -> list[Path]:
    """Loss over steps per cell, and for MoE cells the routing of every iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    out_dir.mkdir(parents=True, exist_ok=True)
    loss = pd.read_parquet(learning_dir / "loss.parquet")
    route = pd.read_parquet(learning_dir / "routing.parquet")
    written = []
    if not loss.empty:
        fig, ax = plt.subplots(figsize=(8, 4))
        for _cell, frame in loss.groupby("cell"):
            label = f"{frame.strategy.iloc[0]} / {frame.model.iloc[0]} / {frame.bw.iloc[0]}"
            ax.plot(frame.step, frame.train_loss, label=label, lw=1)
        ax.set(xlabel="step", ylabel="training loss (mean over ranks)", title="training loss")
        if loss.cell.nunique() <= 12:
            ax.legend(fontsize=7)
        path = out_dir / "learning_loss.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    if not route.empty:
        longest = route.groupby("cell").step.max().idxmax()
        cell = route[route.cell == longest]
        layer = sorted(cell.layer.unique())[0]
        frame = cell[cell.layer == layer]
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
        share = frame.pivot_table(index="step", columns="dst_rank", values="tokens")
        share = share.div(share.sum(axis=1), axis=0)
        share.plot.area(ax=top, colormap="viridis", lw=0)
        title = f"MoE routing, {layer}: {frame.strategy.iloc[0]} / {frame.model.iloc[0]}"
        top.set(ylabel="share of dispatched tokens", title=title)
        top.legend(title="EP rank", fontsize=7)
        nonuni = frame.drop_duplicates("step")
        sns.lineplot(data=nonuni, x="step", y="nonuniform", ax=bottom, label="non-uniform factor")
        bottom.set(ylabel="(max - min) / mean received")
        fig.tight_layout()
        path = out_dir / "learning_moe_routing.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


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
