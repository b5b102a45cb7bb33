"""Predicted against measured: the traffic type of measured ops, the per-rank comparison of
bytes, messages and message sizes, and the per-rank traffic summary of a prediction."""

from __future__ import annotations

from typing import Any

import pandas as pd

from commscope.collectives.traffic import DEFAULT_BACKEND, op_destinations
from commscope.contracts import parse_ranks
from commscope.predict.ops import resolve_plan


def traffic_of(
    ops: pd.DataFrame, model_spec: dict[str, Any], plan_spec: dict[str, Any], world: int
) -> pd.Series:
    """Traffic type of measured ops (e.g. ``ops.parquet``) from their op and group.

    send/recv: pp; alltoall: ep; a collective on the rank's TP or DP group: tp/dp; on the pair
    (first stage, last stage): emb; MoE's DDP over every rank: dp; anything else: "other".
    """
    plan = resolve_plan(model_spec, plan_spec, world)
    moe = model_spec.get("kind", "gpt") == "moe"
    cache: dict[tuple[int, str, str], str] = {}

    def kind(rank: int, op: str, group: str) -> str:
        key = (rank, op, group)
        if key not in cache:
            members = parse_ranks(group)
            pp_g = plan.group_of("pp", rank)
            out = "other"
            if op in ("send", "recv"):
                out = "pp"
            elif op == "alltoall":
                out = "ep"
            elif len(members) > 1 and plan.pp > 1 and members == [pp_g[0], pp_g[-1]]:
                out = "emb"
            elif plan.tp > 1 and members == plan.group_of("tp", rank):
                out = "tp"
            elif (plan.dp > 1 and members == plan.group_of("dp", rank)) or (
                moe and members == list(range(world))
            ):
                out = "dp"
            cache[key] = out
        return cache[key]

    return pd.Series(
        [
            kind(int(r), o, g)
            for r, o, g in zip(ops["rank"], ops["op"], ops["group_ranks"], strict=True)
        ],
        index=ops.index,
        name="traffic",
    )


def compare_measured(
    pred: pd.DataFrame,
    measured: pd.DataFrame,
    model_spec: dict[str, Any],
    plan_spec: dict[str, Any],
    warmup_steps: int = 2,
) -> pd.DataFrame:
    """Predicted vs measured bytes and message counts per rank, traffic type and steady step.

    ``measured`` is an ops table (one cell); steps below ``warmup_steps`` and set-up ops
    (step -1) are left out. ``match`` is True where bytes and counts agree exactly,
    ``sizes_match`` where the message sizes agree one by one (as sorted lists).
    """
    world = int(pred.attrs["predict"]["nodes"]) * int(pred.attrs["predict"]["ranks_per_node"])
    meas = measured[measured["step"] >= warmup_steps].copy()
    meas["traffic"] = traffic_of(meas, model_spec, plan_spec, world)

    def sizes(b: pd.Series) -> tuple[int, ...]:
        return tuple(sorted(int(x) for x in b))

    got = (
        meas.groupby(["rank", "step", "traffic"])["bytes"]
        .agg(measured_bytes="sum", measured_msgs="size", measured_sizes=sizes)
        .reset_index()
    )
    want = (
        pred.groupby(["rank", "traffic"])["bytes"]
        .agg(predicted_bytes="sum", predicted_msgs="size", predicted_sizes=sizes)
        .reset_index()
    )
    steps = pd.DataFrame({"step": sorted(meas["step"].unique())})
    out = want.merge(steps, how="cross").merge(got, on=["rank", "step", "traffic"], how="outer")
    for col in ("predicted_bytes", "predicted_msgs", "measured_bytes", "measured_msgs"):
        out[col] = out[col].fillna(0).astype("int64")
    for col in ("predicted_sizes", "measured_sizes"):
        out[col] = [v if isinstance(v, tuple) else () for v in out[col]]
    out["match"] = (out["predicted_bytes"] == out["measured_bytes"]) & (
        out["predicted_msgs"] == out["measured_msgs"]
    )
    # Stronger than the totals: the same multiset of message sizes (bucket by bucket).
    out["sizes_match"] = out["predicted_sizes"] == out["measured_sizes"]
    out = out.drop(columns=["predicted_sizes", "measured_sizes"])
    return out.sort_values(["rank", "step", "traffic"]).reset_index(drop=True)


def _sizes_text(sizes: pd.Series) -> str:
    counts = sizes.value_counts().sort_index(ascending=False)
    return "; ".join(f"{int(s)}x{int(n)}" for s, n in counts.items())


def _sent_bytes(pred: pd.DataFrame) -> pd.Series:
    """Bytes each row's rank transmits under the prediction's backend (its
    ``attrs["predict"]["backend"]``, NCCL when absent; collectives.traffic.op_destinations,
    summed)."""
    backend = pred.attrs.get("predict", {}).get("backend") or DEFAULT_BACKEND
    keys = ["op", "bytes", "group_ranks", "rank", "peer", "root"]
    uniq = pred[keys].drop_duplicates()
    sent = {
        tuple(k): sum(b for _, b in op_destinations(*k, backend=backend))
        for k in uniq.itertuples(index=False, name=None)
    }
    return pd.Series(
        [sent[k] for k in pred[keys].itertuples(index=False, name=None)], index=pred.index
    )


def summarize(pred: pd.DataFrame) -> pd.DataFrame:
    """Per rank and traffic type: ``bytes`` (payload, summed as in the ops table), ``sent_bytes``
    (what the rank puts on the wire under the ring model), ``messages``, smallest/mean/largest
    message, and ``sizes`` ("bytes x count; ..." largest first)."""
    df = pred.assign(sent_bytes=_sent_bytes(pred))
    g = df.groupby(["rank", "node", "traffic"])
    out = g.agg(
        bytes=("bytes", "sum"),
        sent_bytes=("sent_bytes", "sum"),
        messages=("bytes", "size"),
        msg_min=("bytes", "min"),
        msg_mean=("bytes", "mean"),
        msg_max=("bytes", "max"),
    )
    out["sizes"] = g["bytes"].apply(_sizes_text)
    return out.reset_index()
